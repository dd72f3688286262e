"""Streams over a backend: MsgStream (plain) and TtMsgStream (time-tick aligned)."""

from msgstream_spark.stream.msgstream import MsgStream, default_repack
from msgstream_spark.stream.names import (
    collection_id_of,
    dml_channel_names,
    to_physical_channel,
    vchannel_name,
)
from msgstream_spark.stream.ttstream import TtMsgStream

__all__ = [
    "MsgStream",
    "TtMsgStream",
    "collection_id_of",
    "default_repack",
    "dml_channel_names",
    "to_physical_channel",
    "vchannel_name",
]
