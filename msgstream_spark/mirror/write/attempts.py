"""A batch's attempts on the Spark path, and which of their files the driver may delete, when.

Each attempt of a batch keeps its changes files and its tasks' claims under ``<batch directory>/e<epoch>/``
(``taskplan.attempt_dir``; the epoch of its writer's hold, ``store/writer.py``). The data files an attempt claimed
are another attempt's to delete only once nothing can commit them any more:

- when the batch starts, the files of attempts of earlier epochs, once this holder's epoch is in the table
  (``Hold.fence``): a deposed writer that wrote them and stalled is refused by the table from then on;
  without earlier attempts' files, only this holder's own earlier attempt's (it runs one at a time);
- after this holder's commit of the batch, or when the batch is found in the table, the files of every attempt
  up to this epoch that no version of the table reads: a batch in the table is never committed again.

An attempt of a later epoch (a successor's) is never touched: a deposed writer that passed its checks before it
stalled deletes nothing of the writer that took over. And a writer whose lease is lost starts no batch.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from msgstream_spark.mirror.store.writer import Hold
from msgstream_spark.mirror.write.taskplan import (
    attempt_dir,
    attempt_epochs,
    changes_dir,
    drop_lost_files,
    list_batch,
    remove_changes,
)

# a batch found in the table keeps the claimed files a version of this long ago reads (vacuum's default
# retention): a file committed with it and compacted away since stays for readers of the older versions
KEEP_S = 7 * 86400.0


def begin_batch(table: Any, hold: Hold, query_id: str, batch_id: int) -> str | None:
    """Before batch ``batch_id`` of ``query_id`` writes anything: LeaseLost if ``hold``'s writer lost its lease or
    was deposed; earlier attempts' files cleared as far as nothing of theirs can land any more. The directory
    this attempt's tasks write in, or None if the batch is already in the table (skipped, its leftovers cleared)."""
    hold.check()
    spec = table.write_spec()
    data_dir = spec.data_dir
    batch = changes_dir(data_dir, query_id, batch_id)
    found = attempt_epochs(table.store, batch)
    have = table.writer_epoch()
    if any(e < hold.epoch for e in found) or have > hold.epoch or (have == hold.epoch and not hold.published):
        hold.fence(table)  # before anything of an earlier holder goes: its commits are refused from then on
    done = table.last_batch(query_id)  # after the fence: a commit that landed before it is seen
    if done is not None and done >= batch_id:
        if found:
            end_batch(table, hold, attempt_dir(batch, hold.epoch), None)  # listed anew: after the batch landed
        return None
    if found:
        first = 0 if hold.published else hold.epoch  # unfenced: this holder's own earlier attempt's only
        listed = list_batch(table.store, batch)  # after the fence: an earlier holder's last claims are in it
        drop_lost_files(table.store, batch, data_dir, epochs=(first, hold.epoch), finish=spec.finish, listed=listed)
        remove_changes(table.store, batch, (first, hold.epoch), listed)
    return attempt_dir(batch, hold.epoch)


def end_batch(table: Any, hold: Hold, attempt: str, written: pa.Table | None) -> None:
    """After the batch is in the table: the files every attempt up to this one claimed that no version reads
    deleted, the attempts' directories removed. ``written``: this attempt's tasks' rows, when its commit put the
    batch in the table (None: another's did; the claimed files the table's versions read within ``KEEP_S`` stay).
    The batch's directory is listed once, after the batch is in the table, and that listing serves both the
    claimed files' deletion and the attempts' removal: an object put after it (a deposed writer's stalled task's)
    stays, for ``msgstream mirror orphans``, with the claim naming its file."""
    batch = attempt.rsplit("/", 1)[0]
    spec = table.write_spec()
    data_dir = spec.data_dir
    listed = list_batch(table.store, batch)
    referenced = None
    if written is None and listed:
        referenced = table.retained_files(KEEP_S, time.time())
    drop_lost_files(table.store, batch, data_dir, written, epochs=(0, hold.epoch), referenced=referenced,
                    finish=spec.finish, listed=listed)
    remove_changes(table.store, batch, (0, hold.epoch), listed)
