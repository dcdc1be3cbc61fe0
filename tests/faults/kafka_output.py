"""A topic read the way a downstream consumer reads it: a plain confluent_kafka consumer with
``isolation.level=read_committed``, from offset 0 of every partition to its end.

The fault tests count the Kafka sink's output and settle the soak's input with it. It shares no code
with onceflow's own readers (`onceflow.sources`), so a bug there cannot hide in the count that checks it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class CommittedRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def read_committed(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[CommittedRecord]:
    """Every record of committed transactions (and every non-transactional one) in ``topic``, per
    partition in offset order; none of an aborted or still open transaction.

    A partition is done at the consumer's end-of-partition event, which a read_committed consumer
    raises at the last stable offset; a topic without partitions yields nothing. ``timeout_s`` bounds
    the wait for the next record or event, not the whole read (a soak's output is millions)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"onceflow-faults-check-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        listed = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if listed is None or listed.error is not None or not listed.partitions:
            return []
        partitions = sorted(listed.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        pending, found = set(partitions), []
        idle_until = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > idle_until:
                raise TimeoutError(f"{topic}: partitions {sorted(pending)} gave nothing for {timeout_s} s")
            for message in consumer.consume(10_000, 0.1):
                idle_until = time.monotonic() + timeout_s
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(error)
                    pending.discard(message.partition())
                    continue
                partition, offset = message.partition(), message.offset()
                assert partition is not None and offset is not None  # a record, not an event, has both
                found.append(CommittedRecord(partition, offset, message.key(), message.value()))
        return sorted(found, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()
