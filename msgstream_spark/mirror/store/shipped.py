"""A shipped store's client made from its own settings only, with the process environment left alone.

A store whose settings were resolved in another process (a Spark task's: unpickled, or built by ``store_for``)
must not pick up the executor's own object_store variables: they could change where or as whom it writes. But
obstore's constructors always start from object_store's ``from_env`` (every ``AWS_*`` / ``GOOGLE_*`` /
``AZURE_*`` variable that is one of its keys, and ``SERVICE_ACCOUNT``, ``MSI_ENDPOINT``) and apply the given
config over it; and removing the variables around the call (``unsetenv``) is unsafe while other threads of the
process read the environment (obstore's runtime, pyarrow's and delta-rs's clients), so it is not done.

Instead :func:`pins` reads (only reads) the environment as ``from_env`` would and, for every variable that would
take effect and is not among the shipped settings, gives the value that undoes it: object_store's default
(``false``, ``etag``, ``us-east-1``, the AWS endpoint of the bucket), or, for credentials, the shipped static
credentials pinned through a credential provider (S3) or the shipped credential kind pinned by
``azure_credential_type`` (Azure). A variable that changes the store and has no such value (an S3 server-side
encryption, a credential of another kind than the shipped one that would take precedence over it) is a
StoreError naming it, with the fix: give the key in the driver's settings (``--storage-option``), or unset it
where the tasks run. The HTTP client's variables (``AWS_ALLOW_HTTP``, ``AWS_PROXY_URL``, ...) are undone by always
passing the client options, which replace them. When the driver ships no credential at all (its machine's own
identity: an instance role), each process uses its own machine's, so its credential variables stay in effect
(an ECS task role, a pod identity). Written against object_store 0.14 (obstore 0.12)'s keys.
"""

from __future__ import annotations

from collections.abc import Mapping

from msgstream_spark.mirror.store.errors import StoreError

FALSE = "false"
# variable (lower case) -> the key it sets (object_store's canonical name; the same as settings' where it has one)
_S3_ENV = {
    **{f"aws_{k}": f"aws_{k}" for k in (
        "access_key_id", "secret_access_key", "default_region", "region", "bucket", "endpoint", "session_token",
        "virtual_hosted_style_request", "s3_express", "imdsv1_fallback", "metadata_endpoint", "unsigned_payload",
        "checksum_algorithm", "container_credentials_relative_uri", "container_credentials_full_uri",
        "container_authorization_token_file", "web_identity_token_file", "role_arn", "role_session_name",
        "skip_signature", "copy_if_not_exists", "conditional_put", "disable_tagging", "disable_bulk_delete",
        "request_payer", "server_side_encryption", "sse_kms_key_id", "sse_bucket_key_enabled",
        "sse_customer_key_base64", "endpoint_url_s3", "endpoint_url_sts")},
    "aws_bucket_name": "aws_bucket", "aws_endpoint_url": "aws_endpoint", "aws_token": "aws_session_token",
}
_S3_NEUTRAL = {"aws_virtual_hosted_style_request": FALSE, "aws_s3_express": FALSE, "aws_imdsv1_fallback": FALSE,
               "aws_unsigned_payload": FALSE, "aws_skip_signature": FALSE, "aws_disable_tagging": FALSE,
               "aws_disable_bulk_delete": FALSE, "aws_request_payer": FALSE, "aws_conditional_put": "etag",
               "aws_metadata_endpoint": "http://169.254.169.254", "aws_role_session_name": "WebIdentitySession"}
_S3_MOOT = {"aws_bucket", "aws_copy_if_not_exists"}  # the URL sets the bucket; the store never copies
_S3_CREDENTIALS = {"aws_access_key_id", "aws_secret_access_key", "aws_session_token", "aws_web_identity_token_file",
                   "aws_role_arn", "aws_container_credentials_relative_uri", "aws_container_credentials_full_uri",
                   "aws_container_authorization_token_file"}
# with no credential shipped (the driver's machine's own identity: an instance role), each process uses its own
# machine's: its credential variables then stay in effect
_S3_OWN = _S3_CREDENTIALS | {"aws_role_session_name", "aws_endpoint_url_sts", "aws_metadata_endpoint",
                             "aws_imdsv1_fallback"}
_GCS_ENV = {"google_service_account": "google_service_account", "google_service_account_path":
            "google_service_account", "service_account": "google_service_account",
            "google_service_account_key": "google_service_account_key", "google_bucket": "google_bucket",
            "google_bucket_name": "google_bucket", "google_base_url": "google_base_url",
            "google_application_credentials": "google_application_credentials",
            "google_bearer_token": "google_bearer_token", "google_skip_signature": "google_skip_signature"}
_AZ_ALIASES = {
    "azure_storage_account_key": ("azure_storage_access_key", "azure_storage_master_key"),
    "azure_storage_account_name": (), "azure_client_id": ("azure_storage_client_id",),
    "azure_client_secret": ("azure_storage_client_secret",),
    "azure_tenant_id": ("azure_storage_tenant_id", "azure_storage_authority_id", "azure_authority_id"),
    "azure_authority_host": ("azure_storage_authority_host",),
    "azure_storage_sas_key": ("azure_storage_sas_token",), "azure_storage_token": (),
    "azure_storage_use_emulator": (), "azure_storage_endpoint": ("azure_endpoint",),
    "azure_msi_endpoint": ("azure_identity_endpoint", "msi_endpoint"), "azure_object_id": (),
    "azure_msi_resource_id": (), "azure_federated_token_file": (), "azure_use_fabric_endpoint": (),
    "azure_use_azure_cli": (), "azure_skip_signature": (), "azure_container_name": (), "azure_disable_tagging": (),
    "azure_fabric_token_service_url": (), "azure_fabric_workload_host": (), "azure_fabric_session_token": (),
    "azure_fabric_cluster_identifier": (), "azure_credential_type": (), "azure_storage_encryption_key": ()}
_AZ_ENV = {alias: canon for canon, more in _AZ_ALIASES.items() for alias in (canon, *more)}
_AZ_NEUTRAL = {"azure_storage_use_emulator": FALSE, "azure_use_fabric_endpoint": FALSE, "azure_use_azure_cli": FALSE,
               "azure_skip_signature": FALSE, "azure_disable_tagging": FALSE,
               "azure_authority_host": "https://login.microsoftonline.com"}
_AZ_FABRIC = ("azure_fabric_token_service_url", "azure_fabric_workload_host", "azure_fabric_session_token",
              "azure_fabric_cluster_identifier")
# Azure credential kind (azure_credential_type) -> the keys its resolver reads
_AZ_READS = {"bearer_token": {"azure_storage_token"}, "access_key": {"azure_storage_account_key"},
             "sas_token": {"azure_storage_sas_key"}, "azure_cli": set(),
             "client_secret": {"azure_client_id", "azure_client_secret", "azure_tenant_id"},
             "workload_identity": {"azure_client_id", "azure_tenant_id", "azure_federated_token_file"},
             "managed_identity": {"azure_client_id", "azure_object_id", "azure_msi_resource_id",
                                  "azure_msi_endpoint"}}


def env_settings(kind: str, env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """What object_store's ``from_env`` takes from ``env`` for a store of ``kind``: key -> (variable, value)."""
    prefix, table = {"s3": ("AWS_", _S3_ENV), "gcs": ("GOOGLE_", _GCS_ENV), "azure": ("AZURE_", _AZ_ENV)}[kind]
    out: dict[str, tuple[str, str]] = {}
    for name, value in env.items():
        key = table.get(name.lower())
        if key is not None and (name.startswith(prefix) or name in ("SERVICE_ACCOUNT",)):
            out[key] = (name, value)
    if kind == "azure" and "MSI_ENDPOINT" in env:
        out["azure_msi_endpoint"] = ("MSI_ENDPOINT", env["MSI_ENDPOINT"])
    return out


def pins(kind: str, options: Mapping[str, str], bucket: str,
         env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str] | None]:
    """(config keys to add to ``options`` so that nothing of ``env`` takes effect, static S3 credentials to pin
    through a credential provider or None); StoreError naming each variable that cannot be undone."""
    foreign = {k: v for k, v in env_settings(kind, env).items() if k not in options}
    if not foreign:
        return {}, None
    pin, creds, stuck = {"s3": _s3, "gcs": _gcs, "azure": _azure}[kind](options, foreign, bucket)
    if stuck:
        names = ", ".join(sorted(foreign[k][0] for k in stuck))
        raise StoreError(f"the store of {bucket} was opened from the driver's settings, and this process's "
                         f"environment sets {names}, which would change it and which object_store has no setting "
                         "to undo: give the key in the driver's storage settings (--storage-option KEY=VALUE, "
                         "any value), or unset it where the tasks run")
    return pin, creds


def _true(options: Mapping[str, str], key: str) -> bool:
    return str(options.get(key, "")).strip().lower() in ("1", "true", "yes", "on")


def _s3_source(keys: set[str]) -> str:
    if keys & {"aws_access_key_id", "aws_secret_access_key"}:
        return "static"
    if {"aws_web_identity_token_file", "aws_role_arn"} <= keys:
        return "web identity"
    if "aws_container_credentials_relative_uri" in keys:
        return "task"
    if {"aws_container_credentials_full_uri", "aws_container_authorization_token_file"} <= keys:
        return "pod identity"
    return "instance"


def _s3(options: Mapping[str, str], foreign: dict, bucket: str) -> tuple[dict, dict | None, set]:
    pin: dict[str, str] = {}
    stuck: set[str] = set()
    region = options.get("aws_region") or options.get("aws_default_region") or "us-east-1"
    source = _s3_source(set(options))
    creds = None
    if source == "static" and set(foreign) & _S3_CREDENTIALS:  # the shipped keys, and no token of this process
        creds = {"access_key_id": options.get("aws_access_key_id", ""),
                 "secret_access_key": options.get("aws_secret_access_key", ""),
                 "token": options.get("aws_session_token")}
    own = source == "instance" and not _true(options, "aws_skip_signature")
    for key in foreign:
        if own and key in _S3_OWN:
            continue
        if key in _S3_NEUTRAL:
            pin[key] = _S3_NEUTRAL[key]
        elif key in ("aws_region", "aws_default_region"):
            pin["aws_region"] = region
        elif key in ("aws_endpoint", "aws_endpoint_url_s3"):
            if _true(options, "aws_s3_express") and "aws_endpoint" not in options:
                stuck.add(key)
            virtual = _true(options, "aws_virtual_hosted_style_request")
            name = bucket.split("://", 1)[1]
            pin["aws_endpoint_url_s3"] = options.get("aws_endpoint") or (
                f"https://{name}.s3.{region}.amazonaws.com" if virtual else f"https://s3.{region}.amazonaws.com")
        elif key == "aws_endpoint_url_sts":
            pin[key] = f"https://sts.{region}.amazonaws.com"
        elif key in _S3_CREDENTIALS:
            if source != "static" and not _true(options, "aws_skip_signature") and \
                    _s3_source(set(options) | set(foreign)) != source:
                stuck.add(key)  # a credential of another kind than the shipped one, taking precedence
        elif key not in _S3_MOOT:
            stuck.add(key)  # the checksum, the server-side encryption: no value means "none"
    return pin, creds, stuck


def _gcs_source(keys: set[str]) -> str:
    if "google_bearer_token" in keys:
        return "bearer token"
    if {"google_service_account", "google_service_account_key"} <= keys:
        return "both: an error"
    if keys & {"google_service_account", "google_service_account_key"}:
        return "service account"
    return "application default" if "google_application_credentials" in keys else "default"


def _gcs(options: Mapping[str, str], foreign: dict, bucket: str) -> tuple[dict, None, set]:
    pin = {"google_skip_signature": FALSE} if "google_skip_signature" in foreign else {}
    stuck = {k for k in foreign if k in ("google_base_url",)}
    source = _gcs_source(set(options))
    if source != "default" and source != _gcs_source(set(options) | set(foreign)):  # default: its own identity
        stuck |= {k for k in foreign if k not in ("google_bucket", "google_skip_signature", "google_base_url")}
    return pin, None, stuck


def _azure_kind(keys: set[str], options: Mapping[str, str]) -> str:
    """The credential kind object_store's "auto" picks from these keys (resolve_credential_auto's order)."""
    if set(_AZ_FABRIC) <= keys:
        return "fabric"
    for kind in ("bearer_token", "access_key", "workload_identity", "client_secret", "sas_token"):
        if _AZ_READS[kind] <= keys:
            return kind
    return "azure_cli" if _true(options, "azure_use_azure_cli") else "managed_identity"


def _azure(options: Mapping[str, str], foreign: dict, bucket: str) -> tuple[dict, None, set]:
    kind = options.get("azure_credential_type") or _azure_kind(set(options), options)
    own = kind == "managed_identity" and not set(options) & (_AZ_READS[kind] | {"azure_credential_type"})
    pin: dict[str, str] = {}
    if kind != "fabric" and not own and "azure_credential_type" not in options:
        pin["azure_credential_type"] = kind  # the shipped kind: another kind's variables are then never read
    reads = set() if own else set(_AZ_READS.get(kind, {"azure_storage_token", "azure_credential_type"}))
    reads |= {"azure_storage_encryption_key", "azure_storage_endpoint"}
    if _true(options, "azure_storage_use_emulator"):  # the emulator takes any static credential, whatever the kind
        reads |= {"azure_storage_account_key", "azure_storage_token", "azure_storage_sas_key"}
    if "@" not in bucket and "." not in bucket.split("://", 1)[1]:
        reads.add("azure_storage_account_name")  # az://container: the account is a setting, not in the URL
    stuck: set[str] = set()
    for key in foreign:
        if key in _AZ_NEUTRAL and not (own and key in ("azure_use_azure_cli", "azure_authority_host")):
            pin[key] = _AZ_NEUTRAL[key]
        elif key in reads:
            stuck.add(key)
    return pin, None, stuck
