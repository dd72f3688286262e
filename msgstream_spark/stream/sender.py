"""Per-channel fan-out: one ordered batch per channel, channels in parallel; and closing.

``MsgStream.produce/broadcast`` and the sink's task writer both send this way. Order within a
channel is what Milvus relies on; channels are independent, so they go out concurrently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from msgstream_spark.errors import ProduceError

B = TypeVar("B")
R = TypeVar("R")


def send_per_channel(batches: Mapping[str, B], send: Callable[[str, B], R], *,
                     max_workers: int = 8) -> dict[str, R]:
    """``send(channel, batch)`` for every channel, in parallel; their results by channel.

    When channels fail, raises a :class:`ProduceError` naming each failed channel, chained
    from the first failure; its ``results`` attribute holds what the other channels wrote.
    """
    if len(batches) == 1:
        ch, batch = next(iter(batches.items()))
        return {ch: send(ch, batch)}
    results: dict[str, R] = {}
    errors: list[ProduceError] = []
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(batches)))) as pool:
        futs = {ch: pool.submit(send, ch, batch) for ch, batch in batches.items()}
        for ch, fut in futs.items():
            try:
                results[ch] = fut.result()
            except ProduceError as exc:
                errors.append(exc)
    if errors:
        chans = ", ".join(str(e.channel) for e in errors)
        first = errors[0]
        err = ProduceError(f"produce failed on channel(s) {chans}: {first}", channel=first.channel,
                           failures=first.failures, ids=first.ids)
        err.results = results  # type: ignore[attr-defined]  # what was written elsewhere
        raise err from first
    return results


def close_all(resources: Iterable[Any], *more: Callable[[], Any]) -> BaseException | None:
    """Close every resource, then call each of ``more``; the first error, or None.

    Nothing stops at a failure: every producer, consumer and client is released.
    """
    first: BaseException | None = None
    for res in resources:
        try:
            res.close()
        except Exception as exc:  # noqa: BLE001 - close everything, report the first
            first = first or exc
    for fn in more:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            first = first or exc
    return first
