"""The database job's collection list (``mirror.many.ManyState``, ``<checkpoint>/collections.json``) is saved before
each batch's writes: a batch that tells nothing new leaves the file as it is (issue #44: serialized and rewritten
every batch, 14 ms of driver CPU each at 20 collections), and one that does rewrites it atomically with the news;
a restart reads what the last save wrote."""

from __future__ import annotations

import json
import os

from msgstream_spark.mirror.many import ManyState


def test_a_save_with_nothing_new_leaves_the_file_and_news_replace_it(tmp_path):
    state = ManyState.load(str(tmp_path))
    for cid in (11, 12):
        state.seen(cid, f"c{cid}", "db1")
    state.save()
    path = tmp_path / "collections.json"
    first = os.stat(path).st_ino
    state.seen(11, "c11", "db1")  # known already: nothing new
    state.save()
    assert os.stat(path).st_ino == first  # not rewritten (a rewrite replaces the file: a new inode)
    state.get(12).location = str(tmp_path / "lake" / "db1" / "c12")
    state.save()
    assert os.stat(path).st_ino != first
    assert json.loads(path.read_text())["12"]["location"] == str(tmp_path / "lake" / "db1" / "c12")
    again = ManyState.load(str(tmp_path))
    assert again.known == state.known
    again.save()  # a new job's first save writes, whatever the file holds
    assert ManyState.load(str(tmp_path)).known == state.known
