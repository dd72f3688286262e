"""Storage settings in the convention delta-rs, Polars and obstore share: Rust ``object_store``'s keys.

:func:`resolve_options` reads them from the environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*`` variables that are
object_store keys; no other variable is looked at, so a login shell's ``TOKEN`` or ``ADDRESS`` never leaks in),
then lets explicit options (``--storage-option KEY=VALUE``, the data source's and the Python API's) override them,
case-insensitively and under any alias object_store accepts (``endpoint``, ``aws_endpoint_url``, ...). Keys come
back canonical (``aws_endpoint``, ``aws_allow_http``). :func:`mask` hides their secrets in every log line, error
and printed summary (by :mod:`msgstream_spark.config.secrets`, the package's one definition of a secret). The
``for_*`` functions give the same settings in the form each reader takes (pyiceberg's FileIO properties,
pyarrow's S3FileSystem).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, overload

from msgstream_spark.config import mask_mapping, mask_text
from msgstream_spark.errors import ConfigError

# object_store's HTTP client keys: each kind takes them with its prefix (aws_allow_http) or bare (allow_http)
_CLIENT = ("allow_http", "allow_invalid_certificates", "connect_timeout", "timeout", "proxy_url",
           "proxy_ca_certificate", "proxy_excludes", "user_agent", "http1_only", "http2_only", "pool_idle_timeout",
           "pool_max_idle_per_host", "http2_keep_alive_interval", "http2_keep_alive_timeout",
           "http2_keep_alive_while_idle", "default_content_type", "randomize_addresses")
# canonical key -> its other spellings (object_store's AmazonS3ConfigKey, GoogleConfigKey, AzureConfigKey)
_S3 = {"aws_access_key_id": ("access_key_id",), "aws_secret_access_key": ("secret_access_key",),
       "aws_session_token": ("aws_token", "session_token", "token"), "aws_region": ("region",),
       "aws_default_region": ("default_region",), "aws_endpoint": ("aws_endpoint_url", "endpoint_url", "endpoint"),
       "aws_bucket": ("aws_bucket_name", "bucket", "bucket_name"),
       "aws_virtual_hosted_style_request": ("virtual_hosted_style_request",), "aws_s3_express": ("s3_express",),
       "aws_imdsv1_fallback": ("imdsv1_fallback",), "aws_metadata_endpoint": ("metadata_endpoint",),
       "aws_unsigned_payload": ("unsigned_payload",), "aws_checksum_algorithm": ("checksum_algorithm",),
       "aws_container_credentials_relative_uri": (), "aws_container_credentials_full_uri": (),
       "aws_container_authorization_token_file": (), "aws_web_identity_token_file": (), "aws_role_arn": (),
       "aws_role_session_name": (), "aws_sts_endpoint": (), "aws_skip_signature": ("skip_signature",),
       "aws_server_side_encryption": (), "aws_sse_kms_key_id": (), "aws_sse_bucket_key_enabled": (),
       "aws_conditional_put": ("conditional_put",), "aws_copy_if_not_exists": ("copy_if_not_exists",),
       "aws_disable_tagging": ("disable_tagging",), "aws_request_payer": ("request_payer",)}
_GCS = {"google_service_account": ("service_account", "google_service_account_path", "service_account_path"),
        "google_service_account_key": ("service_account_key",),
        "google_bucket": ("google_bucket_name", "bucket", "bucket_name"),
        "google_application_credentials": ("application_credentials",), "google_skip_signature": ("skip_signature",),
        "google_base_url": ("base_url",)}
_AZURE = {"azure_storage_account_name": ("account_name",),
          "azure_storage_account_key": ("azure_storage_access_key", "azure_storage_master_key", "account_key",
                                        "access_key", "master_key"),
          "azure_client_id": ("client_id",), "azure_client_secret": ("client_secret",),
          "azure_tenant_id": ("tenant_id", "azure_authority_id", "authority_id"),
          "azure_authority_host": ("authority_host",),
          "azure_storage_sas_key": ("azure_storage_sas_token", "sas_key", "sas_token"),
          "azure_storage_token": ("bearer_token", "token"), "azure_storage_use_emulator": ("use_emulator",),
          "azure_storage_endpoint": ("azure_endpoint", "endpoint"),
          "azure_msi_endpoint": ("azure_identity_endpoint", "identity_endpoint", "msi_endpoint"),
          "azure_object_id": ("object_id",), "azure_msi_resource_id": ("msi_resource_id",),
          "azure_federated_token_file": ("federated_token_file",),
          "azure_use_fabric_endpoint": ("use_fabric_endpoint",), "azure_use_azure_cli": ("use_azure_cli",),
          "azure_skip_signature": ("skip_signature",), "azure_container_name": ("container_name",),
          "azure_disable_tagging": ("disable_tagging",)}
# keys delta-rs reads for its own S3 log store (not object_store's): passed to deltalake only
DELTA_ONLY = ("aws_s3_allow_unsafe_rename", "aws_s3_locking_provider", "delta_dynamo_table_name")
_KINDS = {"s3": ("aws_", _S3), "gcs": ("google_", _GCS), "azure": ("azure_", _AZURE)}


def _aliases(kind: str) -> dict[str, str]:
    prefix, table = _KINDS[kind]
    out: dict[str, str] = {}
    for canon, others in table.items():
        out[canon] = canon
        out.update((o, canon) for o in others)
    for key in _CLIENT:
        out[key] = out[prefix + key] = prefix + key
    if kind == "s3":
        out.update((k, k) for k in DELTA_ONLY)
    return out


def known_keys(kind: str) -> list[str]:
    """The canonical keys of one kind of store (``s3``, ``gcs``, ``azure``), sorted."""
    return sorted(set(_aliases(kind).values()))


def resolve_options(kind: str, options: Mapping[str, Any] | None = None,
                    env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The storage settings for a store of ``kind``: object_store variables of the environment (``env``, default
    ``os.environ``), overridden by ``options``; canonical lower-case keys, string values. An option that is no
    key of this kind is a ConfigError naming it; a local store takes none (its options are ignored)."""
    if kind not in _KINDS:
        return {}
    prefix = _KINDS[kind][0]
    aliases = _aliases(kind)
    out: dict[str, str] = {}
    for name, value in (os.environ if env is None else env).items():
        low = name.lower()
        if low.startswith(prefix) and low in aliases and value != "":
            out[aliases[low]] = value
    for name, value in (options or {}).items():
        if value is None:
            continue
        canon = aliases.get(str(name).strip().lower())
        if canon is None:
            raise ConfigError(f"storage option {name!r} is not a setting of {kind} storage (object_store's keys, "
                              f"e.g. {', '.join(known_keys(kind)[:6])}, ...)")
        out[canon] = _text(value)
    return out


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@overload
def mask(value: Mapping[str, Any], options: Mapping[str, Any] | None = None) -> dict[str, Any]: ...
@overload
def mask(value: str, options: Mapping[str, Any] | None = None) -> str: ...
def mask(value, options=None):
    """``value`` with every secret hidden (:mod:`msgstream_spark.config.secrets`, the one definition of a secret):
    a mapping of settings gets its secret values replaced by ``******``; a text (a log line, an error message)
    gets passwords in URLs, secret assignments and every secret value of ``options`` replaced."""
    if isinstance(value, Mapping):
        return mask_mapping(value)
    return mask_text(str(value), options)


def for_obstore(options: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The settings as obstore takes them: (store config, HTTP client options without their prefix), delta-rs's
    own log-store keys left out (obstore 0.12 panics on a client key given in the store config)."""
    config: dict[str, str] = {}
    client: dict[str, str] = {}
    for k, v in options.items():
        bare = k.split("_", 1)[1] if "_" in k else k
        if bare in _CLIENT:
            client[bare] = v
        elif k not in DELTA_ONLY:
            config[k] = v
    return config, client


_PYICEBERG = {"aws_endpoint": "s3.endpoint", "aws_access_key_id": "s3.access-key-id",
              "aws_secret_access_key": "s3.secret-access-key", "aws_session_token": "s3.session-token",
              "aws_region": "s3.region", "aws_role_arn": "s3.role-arn", "aws_role_session_name": "s3.role-session-name",
              "aws_virtual_hosted_style_request": "s3.force-virtual-addressing",
              "aws_request_payer": "s3.request-payer", "azure_storage_account_name": "adls.account-name",
              "azure_storage_account_key": "adls.account-key", "azure_storage_sas_key": "adls.sas-token",
              "azure_tenant_id": "adls.tenant-id", "azure_client_id": "adls.client-id",
              "azure_client_secret": "adls.client-secret"}


# object_store's Azure emulator (``azure_storage_use_emulator``): Azurite's default Blob address and its account
_AZURITE = ("http://127.0.0.1:10000", "devstoreaccount1")
_ARROW_IO = "pyiceberg.io.pyarrow.PyArrowFileIO"


def for_pyiceberg(options: Mapping[str, str]) -> dict[str, str]:
    """The same settings as pyiceberg FileIO properties (``s3.*``, ``gcs.*``, ``adls.*``): an S3 endpoint as
    ``s3.endpoint``, a GCS base URL as ``gcs.service.host``, an Azure endpoint (or the emulator) as the
    ``adls.*-storage-authority`` and ``-scheme`` pyarrow's AzureFileSystem takes, which an Azure store's FileIO
    is (``py-io-impl``; a catalog's own configuration may choose another)."""
    out = {_PYICEBERG[k]: v for k, v in options.items() if k in _PYICEBERG}
    if "s3.region" not in out and "aws_default_region" in options:
        out["s3.region"] = options["aws_default_region"]
    if options.get("google_base_url"):
        out["gcs.service.host"] = options["google_base_url"]
    endpoint = options.get("azure_storage_endpoint")
    if not endpoint and _true(options.get("azure_storage_use_emulator")):
        endpoint = _AZURITE[0]
        out.setdefault("adls.account-name", _AZURITE[1])
    if endpoint:
        out.update(_adls_endpoint(endpoint, out.get("adls.account-name", "")))
    if any(k.startswith("azure_") for k in options):  # pyarrow's, as for s3:// and gs:// (pyiceberg's first
        out["py-io-impl"] = _ARROW_IO  # choice for abfs:// is fsspec's, which needs adlfs, not a dependency)
    return out


def _adls_endpoint(endpoint: str, account: str) -> dict[str, str]:
    """An Azure Blob endpoint as pyarrow's AzureFileSystem takes it: an authority that starts with a dot is the
    host after the account's name (``https://acct.blob.core.windows.net``: ``.blob.core.windows.net``), any
    other is a host to which the account is the first path segment (Azurite: ``http://127.0.0.1:10000/acct``)."""
    scheme, _, rest = endpoint.partition("://")
    if not rest:
        scheme, rest = "https", endpoint
    host = rest.split("/", 1)[0]
    if account and host.startswith(account + "."):
        blob = host[len(account):]
        dfs = blob.replace(".blob.", ".dfs.", 1)
    else:
        blob = dfs = host
    return {"adls.blob-storage-authority": blob, "adls.blob-storage-scheme": scheme,
            "adls.dfs-storage-authority": dfs, "adls.dfs-storage-scheme": scheme}


def for_pyarrow_s3(options: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments of ``pyarrow.fs.S3FileSystem`` for the same S3 settings."""
    kw: dict[str, Any] = {}
    pairs = {"aws_access_key_id": "access_key", "aws_secret_access_key": "secret_key",
             "aws_session_token": "session_token", "aws_role_arn": "role_arn"}
    kw.update((pairs[k], v) for k, v in options.items() if k in pairs)
    region = options.get("aws_region") or options.get("aws_default_region")
    if region:
        kw["region"] = region
    endpoint = options.get("aws_endpoint")
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kw["endpoint_override"] = host.rstrip("/") if host else endpoint
        kw["scheme"] = scheme if host else ("http" if _true(options.get("aws_allow_http")) else "https")
    if _true(options.get("aws_virtual_hosted_style_request")):
        kw["force_virtual_addressing"] = True
    if _true(options.get("aws_skip_signature")):
        kw["anonymous"] = True
    return kw


def _true(value: str | None) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")
