"""Storage settings: object_store's keys from the environment, explicit options over them, any spelling
object_store accepts; nothing else of a login shell's environment; secrets masked in every printed form and in
the errors of a failing put."""

from __future__ import annotations

import pytest

from msgstream_spark.errors import ConfigError
from msgstream_spark.mirror.store import StoreError, mask, open_store, resolve_options
from msgstream_spark.mirror.store.settings import for_pyarrow_s3, for_pyiceberg, known_keys
from tests.fixtures.login_env import DECOYS, login_env
from tests.fixtures.s3_server import SECRET_KEY


def test_environment_then_options_any_case_any_alias():
    env = {"AWS_ENDPOINT_URL": "http://env:1", "AWS_ACCESS_KEY_ID": "AKENV", "AWS_SECRET_ACCESS_KEY": "env-secret",
           "AWS_REGION": "eu-west-1", "AWS_ALLOW_HTTP": "true", "AWS_PROFILE": "not-an-object-store-key"}
    got = resolve_options("s3", {"Endpoint": "http://opt:2", "AWS_SECRET_ACCESS_KEY": "opt-secret",
                                 "aws_virtual_hosted_style_request": False}, env)
    assert got == {"aws_endpoint": "http://opt:2", "aws_access_key_id": "AKENV", "aws_secret_access_key": "opt-secret",
                   "aws_region": "eu-west-1", "aws_allow_http": "true", "aws_virtual_hosted_style_request": "false"}
    assert resolve_options("s3", {"allow_http": "true", "aws_endpoint_url": "http://x"}, {}) == \
        {"aws_allow_http": "true", "aws_endpoint": "http://x"}
    assert resolve_options("azure", {"account_name": "acct", "sas_token": "sv=x"}, {"AZURE_STORAGE_ACCOUNT_KEY": "k"}) \
        == {"azure_storage_account_name": "acct", "azure_storage_sas_key": "sv=x", "azure_storage_account_key": "k"}
    assert resolve_options("gcs", {}, {"GOOGLE_SERVICE_ACCOUNT": "/sa.json", "AWS_REGION": "x"}) == \
        {"google_service_account": "/sa.json"}
    assert resolve_options("local", {"anything": 1}, {"AWS_REGION": "x"}) == {}


def test_an_unknown_option_names_the_key():
    with pytest.raises(ConfigError, match="'aws_endpint'.*s3 storage"):
        resolve_options("s3", {"aws_endpint": "http://x"}, {})
    assert "aws_endpoint" in known_keys("s3") and "azure_storage_account_key" in known_keys("azure")


def test_a_login_shells_generic_variables_never_leak_in():
    env = login_env(base={})
    assert set(DECOYS) <= set(env)
    for kind in ("s3", "gcs", "azure"):
        assert resolve_options(kind, None, env) == {}, kind
    # TOKEN is a spelling of aws_session_token / azure_storage_token as an option, never as a variable
    assert resolve_options("s3", None, {**env, "TOKEN": "t", "SESSION_TOKEN": "t", "ENDPOINT": "e"}) == {}


def test_masking_hides_every_secret_spelling():
    opts = resolve_options("s3", {"access_key_id": "AK", "secret_access_key": "s3cr3t-value", "token": "tok-value",
                                  "endpoint": "http://h:1"}, {})
    shown = mask(opts)
    assert shown["aws_secret_access_key"] == shown["aws_session_token"] == "******"
    assert shown["aws_access_key_id"] == "AK" and shown["aws_endpoint"] == "http://h:1"
    assert mask("denied: key s3cr3t-value, token tok-value", opts) == "denied: key ******, token ******"
    az = resolve_options("azure", {"account_key": "azkey-value", "client_secret": "cs-value", "sas_token": "sv-v"}, {})
    assert set(mask(az).values()) == {"******"}
    assert mask(for_pyiceberg(opts))["s3.secret-access-key"] == "******"


def test_reader_forms():
    opts = resolve_options("s3", {"endpoint": "http://127.0.0.1:9000", "access_key_id": "AK",
                                  "secret_access_key": "SK", "region": "us-east-1", "allow_http": "true"}, {})
    assert for_pyiceberg(opts) == {"s3.endpoint": "http://127.0.0.1:9000", "s3.access-key-id": "AK",
                                   "s3.secret-access-key": "SK", "s3.region": "us-east-1"}
    assert for_pyarrow_s3(opts) == {"access_key": "AK", "secret_key": "SK", "region": "us-east-1",
                                    "endpoint_override": "127.0.0.1:9000", "scheme": "http"}


def test_a_store_from_the_environment_and_its_printed_form(s3, capsys):
    st = open_store(s3.uri("t"), None, env=s3.env())
    assert st.options == s3.options()
    st.put(st.join("x"), b"1")
    print(st, st.masked_options(), st.pyiceberg_properties() and mask(st.pyiceberg_properties()))
    out = capsys.readouterr().out
    assert SECRET_KEY not in out and "******" in out


def test_no_secret_in_the_error_of_a_failing_put(s3, monkeypatch):
    bad = open_store("s3://no-such-bucket-here/t", s3.options(), env={})
    with pytest.raises(StoreError) as e:
        bad.put(bad.join("x"), b"1")
    chain = [e.value, *_causes(e.value)]
    assert "no-such-bucket-here/t/x" in str(e.value)  # names the object
    assert all(SECRET_KEY not in str(x) for x in chain)
    # a client error that quotes the secret (as some services' messages do) is masked too
    import obstore

    st = open_store(s3.uri("t"), s3.options(), env={})

    def quoting_put(*a, **k):
        raise RuntimeError(f"signature mismatch for secret {SECRET_KEY}")

    monkeypatch.setattr(obstore, "put", quoting_put)
    with pytest.raises(StoreError) as e:
        st.put(st.join("y"), b"1")
    assert SECRET_KEY not in str(e.value) and "******" in str(e.value)


def _causes(e: BaseException) -> list[BaseException]:
    out = []
    while e.__cause__ is not None:
        e = e.__cause__
        out.append(e)
    return out


def test_a_task_never_reads_its_own_object_store_variables(s3, monkeypatch):
    """A store made from the driver's resolved settings (``store_for``, or unpickled in a task) ignores the
    executor's own AWS_* variables, although obstore's constructors read them under the settings given: here
    ones that would send its requests elsewhere and sign them with another token."""
    import os
    import pickle

    from msgstream_spark.mirror.store import store_for

    driver = open_store(s3.uri("t"), s3.options(), env={})
    worker_env = {"AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true", "AWS_SESSION_TOKEN": "a-workers-own-token",
                  "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:1"}
    for k, v in worker_env.items():
        monkeypatch.setenv(k, v)
    for i, task in enumerate((store_for(s3.uri("t"), driver.options), pickle.loads(pickle.dumps(driver)))):
        task.put(task.join(f"from-task-{i}"), b"1")
        assert task.read(task.join(f"from-task-{i}")) == b"1"
    assert {k: os.environ.get(k) for k in worker_env} == worker_env  # hidden only while the client was made
