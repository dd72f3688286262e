"""Storage settings: object_store's keys from the environment, explicit options over them, any spelling
object_store accepts; nothing else of a login shell's environment; secrets masked in every printed form and in
the errors of a failing put."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from contextlib import contextmanager

import pytest

from msgstream_spark.errors import ConfigError
from msgstream_spark.mirror.store import AlreadyExists, StoreError, mask, open_store, resolve_options
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



def test_reader_forms_of_gcs_and_azure():
    """pyiceberg's FileIO gets the same GCS and Azure settings: the base URL, the account, its key and the endpoint
    (path-style, as an emulator's; or the account's own host), or object_store's emulator switch."""
    gcs = resolve_options("gcs", {"base_url": "http://127.0.0.1:4443", "service_account": "/sa.json"}, {})
    assert for_pyiceberg(gcs) == {"gcs.service.host": "http://127.0.0.1:4443"}
    az = resolve_options("azure", {"account_name": "devstoreaccount1", "account_key": "k",
                                   "endpoint": "http://127.0.0.1:10000/devstoreaccount1", "allow_http": "true"}, {})
    assert for_pyiceberg(az) == {"adls.account-name": "devstoreaccount1", "adls.account-key": "k",
                                 "adls.blob-storage-authority": "127.0.0.1:10000", "adls.blob-storage-scheme": "http",
                                 "adls.dfs-storage-authority": "127.0.0.1:10000", "adls.dfs-storage-scheme": "http",
                                 "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}
    own = for_pyiceberg(resolve_options("azure", {"account_name": "acct", "endpoint": "https://acct.blob.example"}, {}))
    assert own["adls.blob-storage-authority"] == ".blob.example" and own["adls.dfs-storage-authority"] == ".dfs.example"
    emu = for_pyiceberg(resolve_options("azure", {"use_emulator": "true"}, {}))
    assert emu["adls.account-name"] == "devstoreaccount1" and emu["adls.blob-storage-authority"] == "127.0.0.1:10000"


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


class _ReadOnlyEnviron(MutableMapping):
    """``os.environ`` that fails the test if anything sets or unsets a variable (setenv/unsetenv are unsafe while
    other threads of the process read the environment)."""

    def __init__(self, real) -> None:
        self.real = real

    def __getitem__(self, k):
        return self.real[k]

    def __iter__(self):
        return iter(self.real)

    def __len__(self) -> int:
        return len(self.real)

    def __setitem__(self, k, v):
        raise AssertionError(f"the environment was changed: {k} set")

    def __delitem__(self, k):
        raise AssertionError(f"the environment was changed: {k} unset")


@contextmanager
def _environ_read_only():
    real = os.environ
    os.environ = _ReadOnlyEnviron(real)  # noqa: B003 - swapped for a guard, not cleared
    try:
        yield
    finally:
        os.environ = real  # noqa: B003


# an executor's own variables, each of which obstore would take and which would change where, how or as whom a
# task writes (requests sent elsewhere, virtual-hosted, through a dead proxy, signed with another token, no
# conditional puts, unsigned, requester-pays)
WORKER_ENV = {"AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true", "AWS_SESSION_TOKEN": "a-workers-own-token",
              "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:1", "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
              "AWS_PROXY_URL": "http://127.0.0.1:1", "AWS_CONDITIONAL_PUT": "disabled",
              "AWS_UNSIGNED_PAYLOAD": "true", "AWS_REQUEST_PAYER": "true", "AWS_IMDSV1_FALLBACK": "true",
              "AWS_DEFAULT_REGION": "eu-west-1", "AWS_ROLE_SESSION_NAME": "worker", "AWS_COPY_IF_NOT_EXISTS":
              "multipart"}


def test_a_task_never_reads_its_own_object_store_variables(s3, monkeypatch, tmp_path):
    """A store made from the driver's resolved settings (``store_for``, or unpickled in a task) is not changed by
    the executor's own AWS_* variables, although obstore's constructors read them under the settings given:
    each is overridden by an explicit setting, and the environment is never changed to hide them. Seen by a
    front before the server: the requests are the driver's (path-style, signed, no worker token)."""
    import pickle

    from msgstream_spark.mirror.store import store_for
    from tests.fixtures.s3_front import S3Front

    front = S3Front(s3.endpoint, tmp_path).start()
    try:
        opts = front.options(s3.options())
        driver = open_store(s3.uri("t"), opts, env={})
        for k, v in WORKER_ENV.items():
            monkeypatch.setenv(k, v)
        with _environ_read_only():
            for i, task in enumerate((store_for(s3.uri("t"), driver.options), pickle.loads(pickle.dumps(driver)))):
                task.put_if_absent(task.join(f"from-task-{i}"), b"1")
                assert task.read(task.join(f"from-task-{i}")) == b"1"
                with pytest.raises(AlreadyExists):  # conditional puts still conditional
                    task.put_if_absent(task.join(f"from-task-{i}"), b"2")
        seen = front.seen()
    finally:
        front.stop()
    assert {k: os.environ.get(k) for k in WORKER_ENV} == WORKER_ENV
    assert seen and all(p.startswith(f"/{s3.bucket}/") for _, p, _ in seen)  # path-style, to the driver's endpoint
    assert all("aws4-hmac-sha256" in h.get("authorization", "").lower() for _, _, h in seen)
    assert not [h for _, _, h in seen if "x-amz-security-token" in h or "x-amz-request-payer" in h
                or h.get("x-amz-content-sha256") == "UNSIGNED-PAYLOAD"]


def test_a_task_variable_that_cannot_be_undone_is_refused_naming_it(s3, monkeypatch):
    """A variable object_store has no setting to undo (a server-side encryption), or a credential of another
    kind than the driver's that would take precedence over it (static keys over a web identity): refused naming
    the variable and the fix, never its value, the environment unchanged. With no credential shipped (the
    driver's instance role), a task's own credential variables are its machine's identity: in effect."""
    from msgstream_spark.mirror.store import store_for
    from msgstream_spark.mirror.store.shipped import pins

    monkeypatch.setenv("AWS_SERVER_SIDE_ENCRYPTION", "aws:kms")
    task = store_for(s3.uri("t"), s3.options())
    refused = r"environment sets AWS_SERVER_SIDE_ENCRYPTION.*--storage-option"
    with _environ_read_only(), pytest.raises(StoreError, match=refused):
        task.put(task.join("x"), b"1")
    web = {"aws_web_identity_token_file": "/var/run/token", "aws_role_arn": "arn:aws:iam::1:role/mirror"}
    worker = {"AWS_ACCESS_KEY_ID": "AKWORKER", "AWS_SECRET_ACCESS_KEY": "worker-secret-value"}
    with pytest.raises(StoreError, match="AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY") as e:
        pins("s3", web, "s3://b", worker)
    assert "worker-secret-value" not in str(e.value) and "AKWORKER" not in str(e.value)
    own = {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials/x", "AWS_ROLE_SESSION_NAME": "w", **worker}
    assert pins("s3", {"aws_region": "eu-west-1"}, "s3://b", own) == ({}, None)
    assert pins("s3", {"aws_region": "eu-west-1"}, "s3://b", {"AWS_ENDPOINT_URL": "http://elsewhere:1"}) == \
        ({"aws_endpoint_url_s3": "https://s3.eu-west-1.amazonaws.com"}, None)


def test_what_undoes_a_gcs_or_azure_tasks_variables(monkeypatch):
    """GCS and Azure (no server in the suite): the settings that undo an executor's variables, and the
    variables that are refused; an Azure store built with them under those variables."""
    from msgstream_spark.mirror.store import store_for
    from msgstream_spark.mirror.store.shipped import pins

    az = {"azure_storage_account_name": "acct", "azure_storage_account_key": "a2V5"}
    env = {"AZURE_STORAGE_SAS_TOKEN": "sv=x", "AZURE_CLIENT_ID": "c", "AZURE_CLIENT_SECRET": "s",
           "AZURE_TENANT_ID": "t", "AZURE_USE_AZURE_CLI": "true", "AZURE_STORAGE_USE_EMULATOR": "true",
           "MSI_ENDPOINT": "http://127.0.0.1:1", "AZURE_STORAGE_ACCOUNT_KEY": "b3RoZXI="}
    assert pins("azure", az, "az://box", env) == ({"azure_credential_type": "access_key",
                                                   "azure_use_azure_cli": "false",
                                                   "azure_storage_use_emulator": "false"}, None)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with _environ_read_only():  # obstore takes the settings (object_store's keys) and builds the client
        assert "acct" in repr(store_for("az://box", az).client())
    with pytest.raises(StoreError, match="environment sets AZURE_CLIENT_ID, MSI_ENDPOINT"):  # another identity's
        pins("azure", {"azure_storage_account_name": "acct", "azure_msi_resource_id": "/r/1"}, "az://box", env)
    assert pins("azure", {"azure_storage_account_name": "acct"}, "az://box", env)[0] == \
        {"azure_storage_use_emulator": "false"}  # none shipped: the task's own identity
    with pytest.raises(StoreError, match="AZURE_STORAGE_ACCOUNT_NAME"):
        pins("azure", {"azure_storage_account_key": "a2V5"}, "az://box", {"AZURE_STORAGE_ACCOUNT_NAME": "theirs"})
    assert pins("azure", {"azure_storage_account_key": "a2V5"}, "abfss://box@acct.dfs.core.windows.net",
                {"AZURE_STORAGE_ACCOUNT_NAME": "theirs"})[0] == {"azure_credential_type": "access_key"}
    gcs = {"google_service_account": "/sa.json"}
    assert pins("gcs", gcs, "gs://b", {"GOOGLE_APPLICATION_CREDENTIALS": "/adc.json",
                                       "GOOGLE_SKIP_SIGNATURE": "true"}) == ({"google_skip_signature": "false"}, None)
    for var in ("GOOGLE_BEARER_TOKEN", "GOOGLE_SERVICE_ACCOUNT_KEY", "GOOGLE_BASE_URL"):
        with pytest.raises(StoreError, match=var):
            pins("gcs", gcs, "gs://b", {var: "x"})
    with pytest.raises(StoreError, match="SERVICE_ACCOUNT"):
        pins("gcs", {"google_application_credentials": "/adc.json"}, "gs://b", {"SERVICE_ACCOUNT": "/theirs.json"})
    assert pins("gcs", {}, "gs://b", {"SERVICE_ACCOUNT": "/own.json"}) == ({}, None)  # none shipped: its own
