"""Snapshot routes: the collection's rows at a known point of its log
(through Query, or Milvus's storage files), and the handover to the stream."""
