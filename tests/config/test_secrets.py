"""The one definition of a secret (msgstream_spark/config/secrets.py): each backend's key names, in every
spelling the package meets, are secrets; their values are hidden in printed configs, storage settings, pyiceberg
properties, error texts and command lines; names that are no secret stay readable."""

from __future__ import annotations

import pytest

from msgstream_spark.config import MASK, Config, is_secret, mask_command, mask_mapping, mask_text
from msgstream_spark.mirror.store import mask, resolve_options
from msgstream_spark.mirror.store.settings import for_pyiceberg

SECRETS = {
    "milvus config": ["kafka.saslPassword", "kafka.ssl.tlsKeyPassword", "pulsar.authParams", "milvus.token",
                      "milvus.password", "minio.secretAccessKey"],
    "kafka / pulsar clients": ["sasl.password", "sasl.jaas.config", "ssl.key.password", "ssl.key.pem",
                               "sasl.oauthbearer.client.secret", "basic.auth.user.info", "authParams"],
    "s3": ["aws_secret_access_key", "AWS_SECRET_ACCESS_KEY", "secret_access_key", "aws_session_token",
           "session_token", "aws_token", "token", "aws_sse_customer_key_base64"],
    "gcs": ["google_service_account_key", "service_account_key", "google_service_account", "service_account",
            "google_application_credentials"],
    "azure": ["azure_storage_account_key", "azure_storage_access_key", "azure_storage_master_key", "account_key",
              "access_key", "master_key", "azure_storage_sas_key", "azure_storage_sas_token", "sas_key", "sas_token",
              "azure_client_secret", "client_secret", "azure_storage_token", "bearer_token",
              "azure_storage_encryption_key"],
    "pyiceberg fileio": ["s3.secret-access-key", "s3.session-token", "adls.account-key", "adls.connection-string",
                         "adls.sas-token", "adls.client-secret", "gcs.oauth2.token", "gcs.service-account-key"],
    "iceberg rest catalog": ["token", "credential", "header.Authorization", "rest.signing-secret"],
    "hadoop": ["fs.s3a.secret.key", "fs.s3a.session.token", "fs.azure.account.key.acct.dfs.core.windows.net",
               "fs.azure.sas.container.acct.blob.core.windows.net"],
}
PLAIN = ["aws_access_key_id", "access_key_id", "s3.access-key-id", "aws_region", "aws_endpoint", "aws_allow_http",
         "aws_sse_kms_key_id", "azure_storage_account_name", "adls.account-name", "azure_client_id", "uri",
         "warehouse", "kafka.saslUsername", "kafka.brokerList", "kafka.ssl.tlsKey", "milvus.user", "primary_key",
         "milvus.tls.clientKey", "google_bucket", "mq.type"]


@pytest.mark.parametrize("backend", SECRETS)
def test_each_backends_secret_keys_are_secrets_and_masked(backend):
    for key in SECRETS[backend]:
        assert is_secret(key), key
        shown = mask_mapping({key: "v4lue-of-it", "aws_region": "eu-west-1"})
        assert shown == {key: MASK, "aws_region": "eu-west-1"}, key
        for text in (f"{key}=v4lue-of-it", f"{key}: v4lue-of-it", f'{{"{key}": "v4lue-of-it"}}'):
            assert "v4lue-of-it" not in mask_text(text), text
        assert "v4lue-of-it" not in mask_command(["prog", "--option", f"{key}=v4lue-of-it"]), key


def test_names_that_hold_no_secret_stay_readable():
    assert not [k for k in PLAIN if is_secret(k)]
    assert mask_mapping({"aws_region": "x", "milvus.user": "alice", "empty_token": ""}) == \
        {"aws_region": "x", "milvus.user": "alice", "empty_token": ""}


def test_storage_settings_and_their_pyiceberg_form_are_masked():
    az = resolve_options("azure", {"account_name": "acct", "account_key": "azk3y-value", "sas_token": "sv=abc",
                                   "client_secret": "cs-value", "client_id": "cid", "tenant_id": "tid"}, {})
    assert {k for k, v in mask(az).items() if v == MASK} == \
        {"azure_storage_account_key", "azure_storage_sas_key", "azure_client_secret"}
    ice = for_pyiceberg(az)
    assert ice["adls.account-key"] == "azk3y-value"
    assert {k for k, v in mask(ice).items() if v == MASK} == {"adls.account-key", "adls.sas-token",
                                                              "adls.client-secret"}
    assert "azk3y-value" not in mask(f"refused: {ice}") and "cs-value" not in mask(f"refused: {ice}")
    assert mask("failed with key azk3y-value", az) == f"failed with key {MASK}"


def test_a_printed_config_hides_every_backends_secret():
    cfg = Config.from_dict({"mq": {"type": "kafka"}, "kafka": {"brokerList": "k:1", "saslPassword": "pw-1234",
                                                               "producer": {"sasl.password": "pw-5678",
                                                                            "ssl.key.pem": "-----BEGIN"}},
                            "pulsar": {"authParams": "token:abcd"}, "milvus": {"token": "root:Milvus"}})
    shown = repr(cfg.masked())
    assert not [s for s in ("pw-1234", "pw-5678", "-----BEGIN", "abcd", "root:Milvus") if s in shown]
    assert cfg.masked()["kafka.brokerlist"] == "k:1"


def test_authorization_headers_and_urls_in_texts():
    assert mask_text("header.Authorization=Bearer eyJhbGc.x.y and more") == f"header.Authorization={MASK} and more"
    assert mask_text("Authorization: Basic dXNlcjpwYXNz") == f"Authorization: {MASK}"
    assert mask_text("postgresql://mirror:pw-1234@db:5432/c") == f"postgresql://mirror:{MASK}@db:5432/c"
    assert mask_command(["p", "--catalog-option", "header.Authorization=Bearer", "eyJ.x.y", "--next"]) == \
        f"p --catalog-option header.Authorization={MASK} {MASK} --next"
    assert mask_command(["p", "--token", "t0ken-value", "--token=t0ken-value", "-c", "print(1)"]) == \
        f"p --token {MASK} --token={MASK} -c print(1)"
