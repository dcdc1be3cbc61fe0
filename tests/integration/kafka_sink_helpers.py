"""What the kafka sink's tests share: staging one epoch of two slices, and reading back what the
committer published (the topic's records, the consumer group's offsets)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from onceflow.config import Settings
from onceflow.offsets import OffsetRange
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.kafka import KafkaCommitter, KafkaWriter

# What `stage_epoch` stages: (slice, task, input offsets); each task stages one record per offset
# (``{task}:{offset}``, keyed ``k0``/``k1`` by parity) and then one record without a key.
STAGED_TASKS = ((0, "s0-t0", (0, 5)), (0, "s0-t1", (5, 9)), (1, "s1-t0", (0, 4)))
NO_KEY = b"\x00nokey"


def sink_setup(settings: Settings, make_topic: Callable[..., str], **config: Any) -> dict[str, Any]:
    """What `stage_epoch` and the readers below work on: a pipeline's name, its input topic (two
    partitions), and the sink's config (``config`` added) publishing to an output topic of three."""
    return {
        "pipeline": f"pk-{uuid.uuid4().hex[:10]}",
        "input": make_topic("sink-in", partitions=2),
        "config": {
            "topic": make_topic("sink-out", partitions=3),
            "bootstrap": settings.kafka_bootstrap,
            **config,
        },
        "bootstrap": settings.kafka_bootstrap,
    }


def read_topic(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[tuple[int, bytes, bytes]]:
    """Every record of the topic up to its end (the last stable offset for read_committed)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    done: set[int] = set()
    records: list[tuple[int, bytes, bytes]] = []
    try:
        for _ in range(600):  # a guard against a hang, not a timing assertion
            if len(done) == partitions:
                break
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                done.add(msg.partition())
                continue
            records.append((msg.partition(), msg.key(), msg.value()))
    finally:
        consumer.close()
    assert len(done) == partitions, "did not reach the end of the topic"
    return records


def stage_epoch(setup: dict[str, Any], epoch: int = 1) -> list[Committable]:
    """Two slices; slice 0 reads input partition 0 in two tasks, slice 1 reads partition 1."""
    committables = []
    for slice_, task, (start, until) in STAGED_TASKS:
        ctx = TaskContext(
            setup["pipeline"],
            epoch,
            slice_,
            task,
            "a1",
            "out",
            (OffsetRange(setup["input"], slice_, start, until),),
        )
        writer = KafkaWriter(setup["config"])
        writer.begin(ctx)
        writer.write({"key": f"k{i % 2}", "value": f"{task}:{i}"} for i in range(start, until))
        writer.write([{"key": None, "value": NO_KEY}])
        committables.append(writer.pre_commit())
    return committables


def stage_and_fail_to_publish(setup: dict[str, Any]) -> list[Committable]:
    """One epoch staged (`stage_epoch`), then a commit of it that fails after slice 0's records reached
    the log, before its transaction commits: none is visible to a read_committed reader, and the aborted
    ones are there for a read_uncommitted one. The epoch's committables, for the retries to publish."""
    committables = stage_epoch(setup)

    def fail(step: str) -> None:
        if step == "kafka.offsets_sent":
            raise RuntimeError("injected failure before commit_transaction")

    with pytest.raises(RuntimeError, match="injected"):
        KafkaCommitter(setup["config"], crash_hook=fail).commit(committables)
    assert published(setup) == []
    assert len(published(setup, "read_uncommitted")) == 9 + 2  # slice 0 reached the log, aborted
    return committables


def staged_values() -> list[bytes]:
    """The values `stage_epoch` stages, in the order one commit of the epoch publishes them."""
    values: list[bytes] = []
    for _, task, (start, until) in STAGED_TASKS:
        values += [f"{task}:{i}".encode() for i in range(start, until)] + [NO_KEY]
    return values


def group_offsets(setup: dict[str, Any]) -> dict[tuple[str, int], int]:
    return KafkaCommitter(setup["config"]).committed_offsets(
        setup["pipeline"], [(setup["input"], 0), (setup["input"], 1)]
    )


def published(setup: dict[str, Any], isolation: str = "read_committed") -> list[tuple[int, bytes, bytes]]:
    return read_topic(setup["bootstrap"], setup["config"]["topic"], 3, isolation)
