"""Config loading, Milvus-style backend selection, env overrides, validation and masking."""

from __future__ import annotations

import textwrap

import pytest

from msgstream_spark.config import Config
from msgstream_spark.errors import BackendUnavailableError, ConfigError
from msgstream_spark.mq.registry import build_client
from msgstream_spark.stream import Factory


def write(tmp_path, text: str, name: str = "milvus.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_packaged_default_is_embedded_log(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = Config.load(env={})
    assert cfg.mq_type == "local"
    assert cfg.get("local.path") == str(tmp_path / "msgstream-data" / "msgstream.db")


def test_repo_conf_files_select_their_backend():
    assert Config.load("conf/msgstream.yaml", env={}).mq_type == "local"
    assert Config.load("conf/kafka.yaml", env={}).mq_type == "kafka"
    assert Config.load("conf/pulsar.yaml", env={}).mq_type == "pulsar"


def test_milvus_yaml_cluster_prefers_pulsar_over_kafka(tmp_path):
    p = write(tmp_path, """
        mq: {type: default}
        pulsar: {address: pulsar.example, port: 6650}
        kafka: {brokerList: kafka.example:9092}
        etcd: {endpoints: [localhost:2379]}   # foreign sections are ignored
        """)
    assert Config.load(p, env={}).mq_type == "pulsar"


def test_default_falls_back_to_kafka_then_errors(tmp_path):
    p = write(tmp_path, "kafka: {brokerList: 'k:9092'}\n")
    assert Config.load(p, env={}).mq_type == "kafka"
    empty = write(tmp_path, "mq: {type: default}\n", "empty.yaml")
    with pytest.raises(ConfigError, match="no backend is configured"):
        _ = Config.load(empty, env={}).mq_type


def test_standalone_local_path_wins_cluster_mode_skips_it(tmp_path):
    p = write(tmp_path, """
        local: {path: data/log.db}
        pulsar: {address: localhost}
        """)
    cfg = Config.load(p, env={})
    assert cfg.mq_type == "local"
    assert cfg.get("local.path") == str(tmp_path / "data" / "log.db")  # relative to the file
    cluster = cfg.with_overrides({"msgstream.mode": "cluster"})
    assert cluster.mq_type == "pulsar"


def test_explicit_type_wins_and_rocksmq_maps_to_local(tmp_path):
    p = write(tmp_path, "mq: {type: kafka}\npulsar: {address: localhost}\n")
    assert Config.load(p, env={}).mq_type == "kafka"
    p2 = write(tmp_path, "mq: {type: rocksmq}\nlocal: {path: x.db}\n", "r.yaml")
    assert Config.load(p2, env={}).mq_type == "local"


def test_keys_are_case_insensitive(tmp_path):
    p = write(tmp_path, "kafka: {BrokerList: 'a:1', readTimeout: 3}\n")
    cfg = Config.load(p, env={})
    assert cfg.get("kafka.brokerList") == "a:1"
    assert cfg.get_int("KAFKA.READTIMEOUT") == 3


def test_environment_overrides_like_milvus(tmp_path):
    p = write(tmp_path, "mq: {type: kafka}\nkafka: {brokerList: 'file:9092'}\n")
    cfg = Config.load(p, env={"KAFKA_BROKERLIST": "env:9092", "MQ_TYPE": "kafka", "UNRELATED": "x"})
    assert cfg.get("kafka.brokerlist") == "env:9092"
    # explicit overrides (e.g. Spark options) beat the environment
    cfg2 = Config.load(p, overrides={"kafka.brokerList": "opt:9092"}, env={"KAFKA_BROKERLIST": "env:9092"})
    assert cfg2.get("kafka.brokerlist") == "opt:9092"


def test_unknown_key_in_own_section_names_key_and_file(tmp_path):
    p = write(tmp_path, "local: {path: x.db, retentionTimeInMinute: 5}\n")
    with pytest.raises(ConfigError) as ei:
        Config.load(p, env={})
    assert "local.retentiontimeinminute" in str(ei.value)
    assert str(p) in str(ei.value)


def test_bad_values_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="mq.type"):
        Config.load(write(tmp_path, "mq: {type: nats}\n"), env={})
    with pytest.raises(ConfigError, match="local.busytimeout"):
        Config.load(write(tmp_path, "local: {busyTimeout: soon}\n", "b.yaml"), env={})
    with pytest.raises(ConfigError, match="not valid YAML"):
        Config.load(write(tmp_path, "mq: [unclosed\n", "c.yaml"), env={})
    with pytest.raises(ConfigError, match="not found"):
        Config.load(tmp_path / "missing.yaml", env={})


def test_secrets_are_masked_when_printed(tmp_path):
    p = write(tmp_path, """
        mq: {type: kafka}
        kafka: {brokerList: 'k:1', saslUsername: alice, saslPassword: s3cr3t-pw}
        pulsar: {authParams: 'token:abc.def.ghi'}
        """)
    cfg = Config.load(p, env={})
    shown = repr(cfg.masked()) + repr(cfg)
    assert "s3cr3t-pw" not in shown and "abc.def.ghi" not in shown
    assert cfg.masked()["kafka.saslpassword"] == "******"
    assert cfg.masked()["kafka.saslusername"] == "alice"


def test_passthrough_maps_are_flattened(tmp_path):
    p = write(tmp_path, "kafka: {producer: {linger.ms: 7}, consumer: {fetch.min.bytes: 2}}\n")
    cfg = Config.load(p, env={})
    assert cfg.section("kafka.producer") == {"linger.ms": 7}
    assert cfg.section("kafka.consumer") == {"fetch.min.bytes": 2}


def test_dml_channel_names_follow_milvus():
    cfg = Config.from_dict({"local": {"path": "x.db"}})
    assert cfg.dml_channel_names(2) == ["by-dev-rootcoord-dml_0", "by-dev-rootcoord-dml_1"]
    assert len(cfg.dml_channel_names()) == 16


def test_unknown_backend_lists_valid_ones():
    cfg = Config.from_dict({"local": {"path": "x.db"}})
    with pytest.raises(BackendUnavailableError) as ei:
        build_client("nats", cfg)
    for name in ("local", "kafka", "pulsar"):
        assert name in str(ei.value)


def test_factory_builds_from_path_mapping_and_config(tmp_path):
    f = Factory({"mq": {"type": "local"}, "local": {"path": str(tmp_path / "a.db")}})
    assert f.backend == "local"
    f2 = Factory("conf/kafka.yaml", **{"kafka.brokerList": "x:1"})
    assert f2.backend == "kafka" and f2.config.get("kafka.brokerlist") == "x:1"
    assert "******" not in repr(f2) and "x:1" not in repr(f2)


def test_backend_not_built_yet_is_a_clear_error(monkeypatch):
    from msgstream_spark.mq import registry

    # a backend known by name whose subpackage this version does not ship (as NATS would be)
    monkeypatch.setitem(registry._BACKENDS, "nats", ("msgstream_spark.mq.nats.client", "NatsClient", None, None))
    with pytest.raises(BackendUnavailableError, match="not available in this version") as ei:
        build_client("nats", Config.from_dict({}))
    assert "pulsar" in str(ei.value)  # the working backends are listed


def test_missing_optional_client_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "confluent_kafka", None)  # as if not installed
    with pytest.raises(BackendUnavailableError, match=r"pip install 'msgstream-spark\[kafka\]'"):
        build_client("kafka", Config.from_dict({"kafka": {"brokerList": "h:1"}}))


def test_a_login_shells_generic_variables_change_no_key(tmp_path):
    """USER, TOKEN, ADDRESS, PASSWORD, ... set every key of the milvus backend before (issue #19)."""
    from tests.fixtures.login_env import login_env
    env = login_env(base={})
    cfg = Config.load(overrides={"mq.type": "milvus", "milvus.token": "t"}, env=env)
    assert cfg.to_dict() == Config.load(overrides={"mq.type": "milvus", "milvus.token": "t"}, env={}).to_dict()
    # every variable named like the last part of a key, or like a milvus.* key without its section
    generic = {k.rsplit(".", 1)[-1].upper(): "decoy" for k in cfg.to_dict()}
    generic.update({k.split(".", 1)[1].replace(".", "_").upper(): "decoy" for k in cfg.to_dict()
                    if k.startswith(("milvus.", "local.", "msgstream."))})
    assert Config.load(env=generic).to_dict() == Config.load(env={}).to_dict()


def test_own_keys_take_the_msgstream_prefix(tmp_path):
    env = {"MSGSTREAM_MILVUS_TOKEN": "tok", "MSGSTREAM_MILVUS_ADDRESS": "m:19530", "MILVUS_USER": "ignored",
           "MSGSTREAM_LOCAL_PATH": str(tmp_path / "x.db"), "MSGSTREAM_MSGSTREAM_MODE": "cluster",
           "MSGSTREAM_MQ_TYPE": "milvus", "MQ_TYPE": "kafka", "MSGSTREAM_NO_SUCH_KEY": "x"}
    cfg = Config.load(env=env)
    assert cfg.get("milvus.token") == "tok" and cfg.get("milvus.address") == "m:19530"
    assert cfg.get("milvus.user") == "" and cfg.get("local.path") == str(tmp_path / "x.db")
    assert cfg.get("msgstream.mode") == "cluster"
    assert cfg.get("mq.type") == "milvus"  # the prefixed name beats Milvus's own
    assert cfg.masked()["milvus.token"] == "******"
    # Milvus's own names, for keys Milvus has, in any of its spellings
    cfg = Config.load(env={"PULSAR_ADDRESS": "pulsar://p:6650", "KAFKA_BROKER_LIST": "k:9092",
                           "PULSAR_MAXMESSAGESIZE": "4096", "MSGCHANNEL_CHANNAMEPREFIX_CLUSTER": "c1"})
    assert cfg.get("pulsar.address") == "pulsar://p:6650" and cfg.get("kafka.brokerlist") == "k:9092"
    assert cfg.get_int("pulsar.maxmessagesize") == 4096 and cfg.dml_channel_names(2)[1] == "c1-rootcoord-dml_1"


def _readme_table() -> dict[str, str]:
    """key -> default of docs/configuration.md's key table (rows naming several keys: ``a`` / ``b`` | ``x / y``)."""
    from pathlib import Path

    rows = {}
    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    table = text.split("| key | default | meaning |", 1)[1].split("\n\n", 1)[0]
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        keys = [k.strip("` ") for k in cells[0].replace(", or ", " / ").replace(",", " / ").split(" / ")]
        section = keys[0].split(".")[0]
        keys = [f"{keys[0].rsplit('.', 1)[0]}{k}" if k.startswith(".")
                else k if k.split(".")[0] == section else f"{section}.{k}" for k in keys]
        defaults = [d.strip("` ") for d in cells[1].replace(", ", " / ").split(" / ")]
        for i, k in enumerate(keys):
            rows[k.lower()] = defaults[i] if len(defaults) == len(keys) else cells[1]
    return rows


def test_the_config_doc_table_lists_every_key_with_its_default():
    from msgstream_spark.config.loader import DEFAULTS

    table = _readme_table()
    assert sorted(set(DEFAULTS) - set(table)) == []
    assert sorted(set(table) - set(DEFAULTS)) == ["kafka.consumer.*", "kafka.producer.*"]
    wrong = {}
    for key, shown in table.items():
        want = DEFAULTS.get(key)
        if want in (None, "") or shown.startswith("("):
            continue  # no default (shown as —), or explained in words
        first = shown.lower().split(" ")[0].strip("`,")
        same = (float(want) == float(first) if isinstance(want, (int, float)) and not isinstance(want, bool)
                else str(want).lower() == first)
        if not same:
            wrong[key] = (shown, want)
    assert wrong == {}


def test_is_set_names_the_keys_a_file_a_variable_or_an_override_gave(tmp_path):
    """What the snapshot's "milvus.address set?" check reads: the given keys, never a default (issue #38)."""
    p = write(tmp_path, "mq: {type: local}\nlocal: {path: x.db}\n")
    env = {"MSGSTREAM_MILVUS_TOKEN": "t", "KAFKA_BROKERLIST": "k:1", "MILVUS_ADDRESS": "ignored:1", "ADDRESS": "x"}
    cfg = Config.load(p, env=env)
    assert {k for k in cfg.to_dict() if cfg.is_set(k)} == {"mq.type", "local.path", "milvus.token",
                                                            "kafka.brokerlist"}
    assert cfg.with_overrides({"milvus.address": "h:1"}).is_set("MILVUS.Address")
    assert not Config.load(env={}).is_set("milvus.address")  # the packaged file's keys are defaults
    assert Config.load(env={"MSGSTREAM_MILVUS_ADDRESS": "m:1"}).is_set("milvus.address")
    assert Config.from_dict({"milvus": {"address": "d:1"}}).is_set("milvus.address")
