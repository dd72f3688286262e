"""The one home of Milvus stream semantics: seek filter, tick-cut planner, per-channel sender,
MsgStream (plain), TtMsgStream (time-tick aligned) and the Factory that builds them from a config.

The 2.6 transaction assembler (``stream.txn``) lives here too, next to the seek filter and the
tick cut it feeds.
"""

from msgstream_spark.stream.factory import Factory
from msgstream_spark.stream.msgstream import MsgStream, default_repack
from msgstream_spark.stream.names import (
    collection_id_of,
    dml_channel_names,
    to_physical_channel,
    vchannel_name,
)
from msgstream_spark.stream.ttstream import TtMsgStream

__all__ = [
    "Factory",
    "MsgStream",
    "TtMsgStream",
    "collection_id_of",
    "default_repack",
    "dml_channel_names",
    "to_physical_channel",
    "vchannel_name",
]
