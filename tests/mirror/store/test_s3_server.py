"""The S3 test double enforces what S3 enforces for the commit and the lease: a second ``If-None-Match: *`` put
of a key is refused with 412, and ``If-Match`` replaces an object only while its etag is unchanged. Spoken to
with boto3 (not the product's client), so this is a fact about the server."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError


def _status(e: ClientError) -> tuple[int, str]:
    return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"]


def test_a_second_create_if_absent_is_refused_with_412(s3):
    c = s3.server.boto3()
    c.put_object(Bucket=s3.bucket, Key="_delta_log/00000000000000000000.json", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=s3.bucket, Key="_delta_log/00000000000000000000.json", Body=b"second", IfNoneMatch="*")
    assert _status(e.value) == (412, "PreconditionFailed")
    assert c.get_object(Bucket=s3.bucket, Key="_delta_log/00000000000000000000.json")["Body"].read() == b"first"


def test_if_match_replaces_only_an_unchanged_object(s3):
    c = s3.server.boto3()
    first = c.put_object(Bucket=s3.bucket, Key="lease", Body=b"a")["ETag"]
    second = c.put_object(Bucket=s3.bucket, Key="lease", Body=b"b", IfMatch=first)["ETag"]
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=s3.bucket, Key="lease", Body=b"c", IfMatch=first)  # stale: the lease moved on
    assert _status(e.value)[0] == 412
    assert c.get_object(Bucket=s3.bucket, Key="lease")["Body"].read() == b"b"
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=s3.bucket, Key="gone", Body=b"x", IfMatch=second)  # no such object
    assert _status(e.value)[0] in (404, 412)


def test_racing_conditional_puts_have_one_winner(s3):
    """S3 applies a conditional put atomically; moto checks and writes without a lock between the two, so the
    fixture serialises its requests (tests/fixtures/moto_serial.py). Eight clients swap the same etag and create
    the same key at once: one of each wins. (An S3 etag is the MD5 of the bytes: a racer writing the bytes the
    etag was taken from would pass ``If-Match`` too, on S3 as here; so no racer writes them.)"""
    import threading

    clients = [s3.server.boto3() for _ in range(8)]
    etag = clients[0].put_object(Bucket=s3.bucket, Key="lease", Body=b"initial")["ETag"]  # no racer writes these bytes
    barrier = threading.Barrier(8)
    swapped, created = [], []

    def racer(i: int) -> None:
        barrier.wait(timeout=30)
        for key, cond, out in (("lease", {"IfMatch": etag}, swapped), ("v1", {"IfNoneMatch": "*"}, created)):
            try:
                clients[i].put_object(Bucket=s3.bucket, Key=key, Body=str(i).encode(), **cond)
                out.append(i)
            except ClientError as e:
                assert _status(e)[0] in (409, 412), e

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(swapped) == 1 and len(created) == 1
    assert clients[0].get_object(Bucket=s3.bucket, Key="lease")["Body"].read() == str(swapped[0]).encode()
