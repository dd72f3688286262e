"""The part of Pulsar's binary protocol the test broker speaks, defined here from the protocol's facts.

Message classes are built at import time from a ``FileDescriptorProto`` assembled below
(proto2; field numbers and command type numbers are those of the Pulsar protocol). Enum
fields are declared as ``int32`` (same varint on the wire), so enum values are plain
constants in this module. Only the fields the broker reads or writes are declared; proto2
keeps any other field a client sends as unknown fields.

Framing (all integers big-endian):
  simple command:  [total size u32][command size u32][BaseCommand]
  payload command: ... [magic 0x0e01 u16][crc32c u32][metadata size u32][MessageMetadata][payload]
where the CRC32C covers everything after itself.
"""

from __future__ import annotations

import struct

import crc32c
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

# -- command types (BaseCommand.type) -------------------------------------------------------------
CONNECT, CONNECTED, SUBSCRIBE, PRODUCER, SEND, SEND_RECEIPT, SEND_ERROR = 2, 3, 4, 5, 6, 7, 8
MESSAGE, ACK, FLOW, UNSUBSCRIBE, SUCCESS, ERROR = 9, 10, 11, 12, 13, 14
CLOSE_PRODUCER, CLOSE_CONSUMER, PRODUCER_SUCCESS, PING, PONG = 15, 16, 17, 18, 19
REDELIVER_UNACKNOWLEDGED_MESSAGES, PARTITIONED_METADATA, PARTITIONED_METADATA_RESPONSE = 20, 21, 22
LOOKUP, LOOKUP_RESPONSE, CONSUMER_STATS, CONSUMER_STATS_RESPONSE, REACHED_END_OF_TOPIC = 23, 24, 25, 26, 27
SEEK, GET_LAST_MESSAGE_ID, GET_LAST_MESSAGE_ID_RESPONSE = 28, 29, 30
ACTIVE_CONSUMER_CHANGE, GET_TOPICS_OF_NAMESPACE, GET_TOPICS_OF_NAMESPACE_RESPONSE = 31, 32, 33
ACK_RESPONSE = 38

# -- enums ----------------------------------------------------------------------------------------
# ServerError
UNKNOWN_ERROR, AUTHENTICATION_ERROR, CONSUMER_BUSY, SERVICE_NOT_READY = 0, 3, 5, 6
CHECKSUM_ERROR, TOPIC_NOT_FOUND, SUBSCRIPTION_NOT_FOUND, CONSUMER_NOT_FOUND = 9, 11, 12, 13
# CommandSubscribe.SubType / InitialPosition
SUB_EXCLUSIVE, SUB_SHARED, SUB_FAILOVER, SUB_KEY_SHARED = 0, 1, 2, 3
INITIAL_LATEST, INITIAL_EARLIEST = 0, 1
# CommandLookupTopicResponse.LookupType, CommandPartitionedTopicMetadataResponse.LookupType
LOOKUP_CONNECT, LOOKUP_FAILED, METADATA_SUCCESS = 1, 2, 0
# CommandAck.AckType
ACK_INDIVIDUAL, ACK_CUMULATIVE = 0, 1
# CompressionType
COMPRESSION_NONE, COMPRESSION_LZ4, COMPRESSION_ZLIB, COMPRESSION_ZSTD, COMPRESSION_SNAPPY = 0, 1, 2, 3, 4

MAGIC_CRC32C = 0x0E01
U64_MAX = (1 << 64) - 1

_T = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "uint64": _T.TYPE_UINT64, "int64": _T.TYPE_INT64, "uint32": _T.TYPE_UINT32, "int32": _T.TYPE_INT32,
    "string": _T.TYPE_STRING, "bytes": _T.TYPE_BYTES, "bool": _T.TYPE_BOOL, "double": _T.TYPE_DOUBLE,
}

# name -> [(field, number, type, repeated?)]; every field is optional or repeated (lenient parsing).
_MESSAGES: dict[str, list[tuple[str, int, str, bool]]] = {
    "KeyValue": [("key", 1, "string", False), ("value", 2, "string", False)],
    "MessageIdData": [("ledgerId", 1, "uint64", False), ("entryId", 2, "uint64", False),
                      ("partition", 3, "int32", False), ("batch_index", 4, "int32", False),
                      ("ack_set", 5, "int64", True), ("batch_size", 6, "int32", False)],
    "MessageMetadata": [("producer_name", 1, "string", False), ("sequence_id", 2, "uint64", False),
                        ("publish_time", 3, "uint64", False), ("properties", 4, "KeyValue", True),
                        ("partition_key", 6, "string", False), ("compression", 8, "int32", False),
                        ("uncompressed_size", 9, "uint32", False), ("num_messages_in_batch", 11, "int32", False),
                        ("event_time", 12, "uint64", False)],
    "SingleMessageMetadata": [("properties", 1, "KeyValue", True), ("partition_key", 2, "string", False),
                              ("payload_size", 3, "int32", False), ("event_time", 5, "uint64", False),
                              ("sequence_id", 8, "uint64", False)],
    "CommandConnect": [("client_version", 1, "string", False), ("auth_data", 3, "bytes", False),
                       ("protocol_version", 4, "int32", False), ("auth_method_name", 5, "string", False)],
    "CommandConnected": [("server_version", 1, "string", False), ("protocol_version", 2, "int32", False),
                         ("max_message_size", 3, "int32", False)],
    "CommandSubscribe": [("topic", 1, "string", False), ("subscription", 2, "string", False),
                         ("subType", 3, "int32", False), ("consumer_id", 4, "uint64", False),
                         ("request_id", 5, "uint64", False), ("consumer_name", 6, "string", False),
                         ("durable", 8, "bool", False), ("start_message_id", 9, "MessageIdData", False),
                         ("initialPosition", 13, "int32", False)],
    "CommandPartitionedTopicMetadata": [("topic", 1, "string", False), ("request_id", 2, "uint64", False)],
    "CommandPartitionedTopicMetadataResponse": [
        ("partitions", 1, "uint32", False), ("request_id", 2, "uint64", False), ("response", 3, "int32", False),
        ("error", 4, "int32", False), ("message", 5, "string", False)],
    "CommandLookupTopic": [("topic", 1, "string", False), ("request_id", 2, "uint64", False),
                           ("authoritative", 3, "bool", False)],
    "CommandLookupTopicResponse": [
        ("brokerServiceUrl", 1, "string", False), ("response", 3, "int32", False),
        ("request_id", 4, "uint64", False), ("authoritative", 5, "bool", False), ("error", 6, "int32", False),
        ("message", 7, "string", False), ("proxy_through_service_url", 8, "bool", False)],
    "CommandProducer": [("topic", 1, "string", False), ("producer_id", 2, "uint64", False),
                        ("request_id", 3, "uint64", False), ("producer_name", 4, "string", False)],
    "CommandSend": [("producer_id", 1, "uint64", False), ("sequence_id", 2, "uint64", False),
                    ("num_messages", 3, "int32", False), ("highest_sequence_id", 6, "uint64", False)],
    "CommandSendReceipt": [("producer_id", 1, "uint64", False), ("sequence_id", 2, "uint64", False),
                           ("message_id", 3, "MessageIdData", False), ("highest_sequence_id", 4, "uint64", False)],
    "CommandSendError": [("producer_id", 1, "uint64", False), ("sequence_id", 2, "uint64", False),
                         ("error", 3, "int32", False), ("message", 4, "string", False)],
    "CommandMessage": [("consumer_id", 1, "uint64", False), ("message_id", 2, "MessageIdData", False),
                       ("redelivery_count", 3, "uint32", False)],
    "CommandAck": [("consumer_id", 1, "uint64", False), ("ack_type", 2, "int32", False),
                   ("message_id", 3, "MessageIdData", True), ("request_id", 8, "uint64", False)],
    "CommandAckResponse": [("consumer_id", 1, "uint64", False), ("request_id", 6, "uint64", False)],
    "CommandFlow": [("consumer_id", 1, "uint64", False), ("messagePermits", 2, "uint32", False)],
    "CommandUnsubscribe": [("consumer_id", 1, "uint64", False), ("request_id", 2, "uint64", False)],
    "CommandSeek": [("consumer_id", 1, "uint64", False), ("request_id", 2, "uint64", False),
                    ("message_id", 3, "MessageIdData", False), ("message_publish_time", 4, "uint64", False)],
    "CommandCloseProducer": [("producer_id", 1, "uint64", False), ("request_id", 2, "uint64", False)],
    "CommandCloseConsumer": [("consumer_id", 1, "uint64", False), ("request_id", 2, "uint64", False)],
    "CommandRedeliverUnacknowledgedMessages": [("consumer_id", 1, "uint64", False),
                                               ("message_ids", 2, "MessageIdData", True)],
    "CommandSuccess": [("request_id", 1, "uint64", False)],
    "CommandProducerSuccess": [("request_id", 1, "uint64", False), ("producer_name", 2, "string", False),
                               ("last_sequence_id", 3, "int64", False)],
    "CommandError": [("request_id", 1, "uint64", False), ("error", 2, "int32", False),
                     ("message", 3, "string", False)],
    "CommandPing": [],
    "CommandPong": [],
    "CommandGetLastMessageId": [("consumer_id", 1, "uint64", False), ("request_id", 2, "uint64", False)],
    "CommandGetLastMessageIdResponse": [("last_message_id", 1, "MessageIdData", False),
                                        ("request_id", 2, "uint64", False),
                                        ("consumer_mark_delete_position", 3, "MessageIdData", False)],
    "CommandGetTopicsOfNamespace": [("request_id", 1, "uint64", False), ("namespace", 2, "string", False)],
    "CommandGetTopicsOfNamespaceResponse": [("request_id", 1, "uint64", False), ("topics", 2, "string", True)],
}

# BaseCommand: type = 1, then one optional sub-command per field number.
_BASE_FIELDS = [
    ("connect", 2, "CommandConnect"), ("connected", 3, "CommandConnected"), ("subscribe", 4, "CommandSubscribe"),
    ("producer", 5, "CommandProducer"), ("send", 6, "CommandSend"), ("send_receipt", 7, "CommandSendReceipt"),
    ("send_error", 8, "CommandSendError"), ("message", 9, "CommandMessage"), ("ack", 10, "CommandAck"),
    ("flow", 11, "CommandFlow"), ("unsubscribe", 12, "CommandUnsubscribe"), ("success", 13, "CommandSuccess"),
    ("error", 14, "CommandError"), ("close_producer", 15, "CommandCloseProducer"),
    ("close_consumer", 16, "CommandCloseConsumer"), ("producer_success", 17, "CommandProducerSuccess"),
    ("ping", 18, "CommandPing"), ("pong", 19, "CommandPong"),
    ("redeliverUnacknowledgedMessages", 20, "CommandRedeliverUnacknowledgedMessages"),
    ("partitionMetadata", 21, "CommandPartitionedTopicMetadata"),
    ("partitionMetadataResponse", 22, "CommandPartitionedTopicMetadataResponse"),
    ("lookupTopic", 23, "CommandLookupTopic"), ("lookupTopicResponse", 24, "CommandLookupTopicResponse"),
    ("seek", 28, "CommandSeek"), ("getLastMessageId", 29, "CommandGetLastMessageId"),
    ("getLastMessageIdResponse", 30, "CommandGetLastMessageIdResponse"),
    ("getTopicsOfNamespace", 32, "CommandGetTopicsOfNamespace"),
    ("getTopicsOfNamespaceResponse", 33, "CommandGetTopicsOfNamespaceResponse"),
    ("ackResponse", 38, "CommandAckResponse"),
]
# The BaseCommand field that carries each command type.
FIELD_OF_TYPE = {num: name for name, num, _ in _BASE_FIELDS}

_PACKAGE = "msgstream_test_broker"


def _build() -> dict[str, type]:
    fdp = descriptor_pb2.FileDescriptorProto(name="msgstream_test_broker.proto", package=_PACKAGE, syntax="proto2")

    def add_field(msg, name: str, number: int, typ: str, repeated: bool) -> None:
        f = msg.field.add(name=name, number=number,
                          label=_T.LABEL_REPEATED if repeated else _T.LABEL_OPTIONAL)
        if typ in _SCALARS:
            f.type = _SCALARS[typ]
        else:
            f.type = _T.TYPE_MESSAGE
            f.type_name = f".{_PACKAGE}.{typ}"

    for name, fields in _MESSAGES.items():
        m = fdp.message_type.add(name=name)
        for fname, num, typ, rep in fields:
            add_field(m, fname, num, typ, rep)
    base = fdp.message_type.add(name="BaseCommand")
    add_field(base, "type", 1, "int32", False)
    for fname, num, typ in _BASE_FIELDS:
        add_field(base, fname, num, typ, False)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{n}"))
            for n in [*_MESSAGES, "BaseCommand"]}


_CLASSES = _build()
BaseCommand = _CLASSES["BaseCommand"]
MessageIdData = _CLASSES["MessageIdData"]
MessageMetadata = _CLASSES["MessageMetadata"]
SingleMessageMetadata = _CLASSES["SingleMessageMetadata"]
KeyValue = _CLASSES["KeyValue"]


class ProtocolError(Exception):
    """A malformed frame; the broker closes the connection."""


def command(cmd_type: int, **fields) -> BaseCommand:
    """A BaseCommand of ``cmd_type`` whose sub-command has ``fields`` set."""
    base = BaseCommand(type=cmd_type)
    sub = getattr(base, FIELD_OF_TYPE[cmd_type])
    sub.SetInParent()
    for k, v in fields.items():
        if v is None:
            continue
        if isinstance(v, (list, tuple)):
            getattr(sub, k).extend(v)
        elif hasattr(v, "DESCRIPTOR"):
            getattr(sub, k).CopyFrom(v)
        else:
            setattr(sub, k, v)
    return base


def encode_frame(cmd: BaseCommand, metadata_and_payload: bytes | None = None, checksum: int | None = None) -> bytes:
    """Frame a command; ``metadata_and_payload`` is ``[metadata size][metadata][payload]``."""
    body = cmd.SerializeToString()
    if metadata_and_payload is None:
        return struct.pack(">II", len(body) + 4, len(body)) + body
    crc = crc32c.crc32c(metadata_and_payload) if checksum is None else checksum
    total = 4 + len(body) + 6 + len(metadata_and_payload)
    return struct.pack(">II", total, len(body)) + body + struct.pack(">HI", MAGIC_CRC32C, crc) + metadata_and_payload


def decode_frame(frame: bytes) -> tuple[BaseCommand, bytes | None, bool]:
    """Split a frame (without its total-size prefix) into command, metadata+payload, checksum ok.

    The command is returned even when a payload frame's CRC32C is wrong (``False``), so the
    broker can answer the sender with the producer and sequence ids of the bad frame.
    """
    if len(frame) < 4:
        raise ProtocolError(f"frame of {len(frame)} bytes is too short")
    (cmd_size,) = struct.unpack_from(">I", frame, 0)
    if cmd_size > len(frame) - 4:
        raise ProtocolError(f"command size {cmd_size} exceeds the frame ({len(frame)} bytes)")
    cmd = BaseCommand.FromString(frame[4:4 + cmd_size])
    rest = frame[4 + cmd_size:]
    if not rest:
        return cmd, None, True
    if len(rest) >= 6 and struct.unpack_from(">H", rest, 0)[0] == MAGIC_CRC32C:
        (crc,) = struct.unpack_from(">I", rest, 2)
        data = bytes(rest[6:])
        return cmd, data, crc32c.crc32c(data) == crc
    return cmd, bytes(rest), True


def split_metadata(metadata_and_payload: bytes) -> tuple[MessageMetadata, bytes]:
    (size,) = struct.unpack_from(">I", metadata_and_payload, 0)
    meta = MessageMetadata.FromString(metadata_and_payload[4:4 + size])
    return meta, metadata_and_payload[4 + size:]


def join_metadata(meta: MessageMetadata, payload: bytes) -> bytes:
    raw = meta.SerializeToString()
    return struct.pack(">I", len(raw)) + raw + payload


def message_id(ledger: int, entry: int, partition: int | None = None, batch_index: int | None = None) -> MessageIdData:
    mid = MessageIdData(ledgerId=ledger & U64_MAX, entryId=entry & U64_MAX)
    if partition is not None:
        mid.partition = partition
    if batch_index is not None:
        mid.batch_index = batch_index
    return mid
