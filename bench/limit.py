"""The physical limit: how fast one plain confluent-kafka consumer reads the whole data set.

No decoding and no output: the consumer is assigned every partition from the start and drains them with
``consume()`` batches until each partition's end. This is the ceiling a Python pipeline on this machine
could reach with the same client; the pipelines are reported as a fraction of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.dataset import PARTITIONS, Dataset


@dataclass(frozen=True)
class ReadRate:
    records: int
    bytes: int
    seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6


def read_all(bootstrap: str, data: Dataset) -> ReadRate:
    """Read every record of the data set once; the clock includes connecting and the first fetch."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    started = time.perf_counter()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "onceflow-bench-limit",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([TopicPartition(data.topic, p, 0) for p in range(PARTITIONS)])
        left, records, size = PARTITIONS, 0, 0
        while left:
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                error = message.error()
                if error is None:
                    records += 1
                    size += len(message.value())
                elif error.code() == KafkaError._PARTITION_EOF:
                    left -= 1
                else:
                    raise RuntimeError(f"reading {data.topic}: {error}")
    finally:
        consumer.close()
    if records != data.records:
        raise RuntimeError(f"read {records} records of {data.topic}, expected {data.records}")
    return ReadRate(records, size, time.perf_counter() - started)
