"""The one Pulsar admin REST call we make: the topics of a namespace (the binary protocol cannot list them).

``GET http(s)://<host of pulsar.address>:<pulsar.webport>/admin/v2/persistent/<tenant>/<namespace>``.
Brokers without an admin REST API (pulsar-lite serves only Prometheus metrics over HTTP, by
default on port 8080, so the request meets a 404 or a closed port) get
:class:`AdminAPIUnavailableError`, which says what needs listing and what to do instead: name
the channels explicitly.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from msgstream_spark.errors import BackendError
from msgstream_spark.mq.pulsar.settings import PulsarSettings


class AdminAPIUnavailableError(BackendError):
    """No Pulsar admin REST API answers at ``pulsar.webport``: channels cannot be listed."""


def list_topics(s: PulsarSettings) -> list[str]:
    """Full names of the persistent topics of ``pulsar.tenant``/``pulsar.namespace``."""
    url = f"{s.web_url}/admin/v2/persistent/{s.tenant}/{s.namespace}"
    req = urllib.request.Request(url, headers=s.http_headers())
    try:
        with urllib.request.urlopen(req, timeout=s.request_timeout) as resp:
            topics = json.loads(resp.read().decode())
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 405):
            raise _unavailable(s, url, f"HTTP {exc.code}") from exc
        raise BackendError(f"listing the topics of {s.tenant}/{s.namespace} through the admin API at {url} "
                           f"failed: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, ConnectionError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ConnectionRefusedError):
            raise _unavailable(s, url, "connection refused") from exc
        raise BackendError(f"listing the topics of {s.tenant}/{s.namespace} through the admin API at {url} "
                           f"failed (is pulsar.webport right?): {reason}") from exc
    except (OSError, ValueError) as exc:
        raise BackendError(f"listing the topics of {s.tenant}/{s.namespace} through the admin API at {url} "
                           f"failed (is pulsar.webport right?): {exc}") from exc
    if not isinstance(topics, list):
        raise BackendError(f"the admin API at {url} did not answer a topic list (got {type(topics).__name__}); "
                           "is pulsar.webport the broker's web service port?")
    return [t for t in topics if isinstance(t, str)]


def _unavailable(s: PulsarSettings, url: str, what: str) -> AdminAPIUnavailableError:
    return AdminAPIUnavailableError(
        f"cannot list the channels of {s.tenant}/{s.namespace}: no Pulsar admin REST API at {url} ({what}; "
        f"is pulsar.webport={s.web_port} the broker's web service port?). Brokers without one, such as "
        "pulsar-lite, cannot list topics: name the channels explicitly instead of a pattern")
