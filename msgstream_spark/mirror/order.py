"""The change order per primary key (``_seq``) as the mirror uses it.

The arithmetic lives in ``msgstream_spark.msg.seq`` (the source's rows builder, below this layer, computes
the column); this module is the mirror's name for it. See docs/mirror.md, "The change order".
"""

from msgstream_spark.msg.seq import (
    MAX_MESSAGE,
    MAX_ROW,
    OP_DELETE,
    OP_INSERT,
    SEQ,
    SEQ_DDL,
    SEQ_TYPE,
    seq_array,
    seq_parts,
    seq_value,
    snapshot_seq,
    snapshot_seq_array,
)

__all__ = ["MAX_MESSAGE", "MAX_ROW", "OP_DELETE", "OP_INSERT", "SEQ", "SEQ_DDL", "SEQ_TYPE", "seq_array", "seq_parts",
           "seq_value", "snapshot_seq", "snapshot_seq_array"]
