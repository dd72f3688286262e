"""server.render_config on an excerpt of Milvus 2.3.5's config template (the wheel's ``config.yaml.template``,
its sections as they are): the MQ Milvus writes to, Kafka or Pulsar, without starting Milvus."""

from __future__ import annotations

import pytest
import yaml

from tests.milvus_real.server import MQ, TUNING, kafka_mq, pulsar_mq, render_config, tune

IPS = "".join(f"{c}:\n  ip: # if not specify address, will use the first unicastable address as local ip\n"
              f"  port: {{{{ {c}_port(int): 1 }}}}\n" for c in ("rootCoord", "proxy", "queryCoord", "queryNode",
                                                                "indexNode", "dataCoord", "dataNode"))
TEMPLATE = """etcd:
  endpoints: localhost:{{ etcd_port(int): 2379 }}
  rootPath: by-dev # The root path where data is stored in etcd
# Milvus supports four MQ: rocksmq(based on RockDB), natsmq(embedded nats-server), Pulsar and Kafka.
mq:
  # Default value: "default"
  # Valid values: [default, pulsar, kafka, rocksmq, natsmq]
  type: rocksmq

# Related configuration of pulsar, used to manage Milvus logs of recent mutation operations.
pulsar:
  address: localhost # Address of pulsar
  port: 6650 # Port of Pulsar
  webport: 80 # Web port of pulsar, if you connect directly without proxy, should use 8080
  maxMessageSize: 5242880 # 5 * 1024 * 1024 Bytes, Maximum size of each message in pulsar.
  tenant: public
  namespace: default

# If you want to enable kafka, needs to comment the pulsar configs
# kafka:
#   brokerList:

rocksmq:
  path: {{ rocksmq_data_dir }}
""" + IPS


def render(mq: MQ) -> dict:
    return yaml.safe_load(render_config(TEMPLATE, {"rocksmq_data_dir": "/x", "etcd_config_path": "/e.yaml"}, mq))


def test_kafka_section_is_added_and_pulsar_left_as_it_was():
    cfg = render(kafka_mq("127.0.0.1:9092"))
    assert cfg["mq"] == {"type": "kafka"} and cfg["kafka"] == {"brokerList": "127.0.0.1:9092", "readTimeout": 1}
    assert cfg["pulsar"]["address"] == "localhost" and cfg["etcd"]["config"] == {"path": "/e.yaml"}
    assert {cfg[c]["ip"] for c in ("proxy", "dataNode")} == {"127.0.0.1"}


def test_pulsar_section_gets_address_port_and_webport_in_place():
    cfg = render(pulsar_mq("127.0.0.1", 6651, 8081))
    assert cfg["mq"] == {"type": "pulsar"} and "kafka" not in cfg
    assert cfg["pulsar"] == {"address": "127.0.0.1", "port": 6651, "webport": 8081, "maxMessageSize": 5242880,
                             "tenant": "public", "namespace": "default"}
    assert cfg["rocksmq"] == {"path": "/x"}


def test_another_mq_type_is_refused():
    with pytest.raises(ValueError, match="natsmq"):
        render(MQ("natsmq", {}))


TUNED = """queryCoord:
  checkInterval: 1000
  distPullInterval: 500
  port: 1
dataCoord:
  segment:
    maxSize: 512 # Maximum size of a segment in MB
    assignmentExpiration: 2000 # ms
  port: 2
"""


def test_tuning_sets_nested_keys_in_place_and_adds_the_missing_ones():
    tuned = tune(TUNED)
    cfg = yaml.safe_load(tuned)
    assert cfg["queryCoord"] == {"port": 1, **{k.split(".")[1]: v for k, v in TUNING.items() if k.startswith("queryC")}}
    assert cfg["dataCoord"] == {"segment": {"maxSize": 512,
                                            "assignmentExpiration": TUNING["dataCoord.segment.assignmentExpiration"]},
                                "port": 2}
    assert "maxSize: 512 # Maximum size of a segment in MB" in tuned and "# ms" in tuned
    with pytest.raises(ValueError, match="dataCoord.segment"):
        tune(TUNED.replace("  segment:", "  other:"))
