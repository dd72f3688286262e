"""The Kafka backend (confluent-kafka): channel = topic, partition 0 only, as Milvus does."""
