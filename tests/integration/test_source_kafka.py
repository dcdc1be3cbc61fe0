"""The Kafka source against the real broker: exact range reads, planning, retention and new partitions."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import NewPartitions

from onceflow.config import Settings
from onceflow.decoding.records import KafkaRecord
from onceflow.errors import ServiceUnavailable
from onceflow.offsets import OffsetRange
from onceflow.pipeline import KafkaSource
from onceflow.sources.errors import OffsetsLost, RangeReadTimeout, TopicNotFound
from onceflow.sources.kafka_metadata import KafkaMetadata
from onceflow.sources.kafka_planning import assign_slices
from onceflow.sources.kafka_range import read_range

pytestmark = pytest.mark.integration


class Writer:
    """Produces to one topic and remembers the offset Kafka gave each value."""

    def __init__(self, bootstrap: str, topic: str, transactional: bool = False) -> None:
        config: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 0}
        if transactional:
            config["transactional.id"] = f"test-source-{uuid.uuid4().hex}"
        self.producer = Producer(config)
        if transactional:
            self.producer.init_transactions(30)
        self.topic = topic
        self.offsets: dict[bytes, int] = {}

    def _delivered(self, err: Any, msg: Any) -> None:
        assert err is None, err
        self.offsets[msg.value()] = msg.offset()

    def send(self, *values: bytes, partition: int = 0, timestamp: int = 0, **kwargs: Any) -> None:
        for value in values:
            self.producer.produce(
                self.topic,
                value=value,
                partition=partition,
                on_delivery=self._delivered,
                timestamp=timestamp,
                **kwargs,
            )
        self.producer.flush(30)

    def transaction(self, *values: bytes, commit: bool = True, partition: int = 0) -> None:
        self.producer.begin_transaction()
        self.send(*values, partition=partition)
        if commit:
            self.producer.commit_transaction(30)
        else:
            self.producer.abort_transaction(30)


@pytest.fixture
def bootstrap(settings: Settings) -> str:
    return settings.kafka_bootstrap


@pytest.fixture
def metadata(bootstrap: str) -> Iterator[KafkaMetadata]:
    with KafkaMetadata(bootstrap) as meta:
        yield meta


def values(records: list[KafkaRecord]) -> list[bytes | None]:
    return [r.value for r in records]


def test_reads_committed_records_only_and_stops_on_position(
    bootstrap: str, make_topic: Callable[..., str], metadata: KafkaMetadata
) -> None:
    topic = make_topic("src-txn")
    writer = Writer(bootstrap, topic, transactional=True)
    writer.transaction(b"c0", b"c1", b"c2")
    writer.transaction(b"a0", b"a1", commit=False)
    writer.transaction(b"d0", b"d1")
    # Three commit/abort markers occupy offsets that are never delivered. A commit returns once the
    # transaction is decided; its marker reaches the partition a moment later, so wait for that.
    expected = len(writer.offsets) + 3
    deadline = time.monotonic() + 15
    [part] = metadata.partitions([topic])
    while part.stable < expected and time.monotonic() < deadline:
        time.sleep(0.1)
        [part] = metadata.partitions([topic])
    assert part.stable == expected

    everything = list(read_range(bootstrap, OffsetRange(topic, 0, 0, part.stable)))
    assert values(everything) == [b"c0", b"c1", b"c2", b"d0", b"d1"]
    assert [r.offset for r in everything] == [writer.offsets[v] for v in values(everything) if v]

    # A range that ends on the commit marker right after d1 ends without delivering the marker.
    up_to_marker = OffsetRange(topic, 0, 0, writer.offsets[b"d1"] + 2)
    assert values(list(read_range(bootstrap, up_to_marker))) == [b"c0", b"c1", b"c2", b"d0", b"d1"]
    # A range made only of aborted records and their marker is read as empty, and terminates.
    aborted_only = OffsetRange(topic, 0, writer.offsets[b"a0"], writer.offsets[b"a1"] + 2)
    assert list(read_range(bootstrap, aborted_only)) == []
    # A range ending in the middle of the aborted transaction stops before d0.
    first_part = OffsetRange(topic, 0, writer.offsets[b"c1"], writer.offsets[b"a1"])
    assert values(list(read_range(bootstrap, first_part, batch_size=1))) == [b"c1", b"c2"]


def test_range_ending_at_the_lso_terminates_while_a_transaction_is_open(
    bootstrap: str, make_topic: Callable[..., str], metadata: KafkaMetadata
) -> None:
    topic = make_topic("src-lso")
    writer = Writer(bootstrap, topic, transactional=True)
    writer.transaction(b"c0", b"c1")
    writer.producer.begin_transaction()
    writer.send(b"open0", b"open1")
    try:
        [part] = metadata.partitions([topic])
        # The open transaction's records are stored, but the read_committed end stops before them.
        assert part.stable == writer.offsets[b"open0"] < writer.offsets[b"open1"] + 1
        plan = metadata.plan(KafkaSource(topics=(topic,)), {}, max_records_per_partition=100)
        assert plan.ranges == (OffsetRange(topic, 0, 0, part.stable),)
        assert values(list(read_range(bootstrap, plan.ranges[0]))) == [b"c0", b"c1"]
        # Beyond the LSO the reader cannot progress: it says so instead of hanging or returning early.
        beyond = OffsetRange(topic, 0, 0, part.stable + 1)
        with pytest.raises(RangeReadTimeout, match=r"stuck at offset"):
            list(read_range(bootstrap, beyond, poll_timeout_s=0.5, stall_timeout_s=2))
    finally:
        writer.producer.abort_transaction(30)


def test_reading_a_range_twice_gives_identical_records_and_tasks_tile_it(
    bootstrap: str, make_topic: Callable[..., str], metadata: KafkaMetadata
) -> None:
    topic = make_topic("src-replay")
    writer = Writer(bootstrap, topic, transactional=True)
    for batch in range(4):
        writer.transaction(*(f"v{batch}-{i}".encode() for i in range(5)), commit=batch != 2)
    plain = Writer(bootstrap, topic)
    plain.send(b"keyed", key=b"k1", headers=[("h", b"x"), ("empty", None)])
    [part] = metadata.partitions([topic])
    whole = OffsetRange(topic, 0, 0, part.stable)

    first = list(read_range(bootstrap, whole, batch_size=3))
    second = list(read_range(bootstrap, whole, batch_size=50))
    assert first == second
    assert len(first) == 16
    assert first[-1].key == b"k1" and first[-1].headers == (("h", b"x"), ("empty", None))
    assert all(r.timestamp is not None for r in first)

    [slice_plan] = assign_slices([whole], slices=1, max_records_per_task=4)
    assert len(slice_plan.tasks) > 1
    by_tasks = [r for task in slice_plan.tasks for r in read_range(bootstrap, task.range)]
    assert by_tasks == first


def test_plans_by_timestamp_for_a_new_pipeline_and_by_data_interval_end(
    bootstrap: str, make_topic: Callable[..., str], metadata: KafkaMetadata
) -> None:
    topic = make_topic("src-time")
    base = int(time.time() * 1000) - 3_600_000
    writer = Writer(bootstrap, topic)
    for i in range(6):
        writer.send(f"r{i}".encode(), timestamp=base + i * 1000)
    offsets = [writer.offsets[f"r{i}".encode()] for i in range(6)]

    source = KafkaSource(topics=(topic,), starting=base + 2500)
    plan = metadata.plan(source, {}, max_records_per_partition=100)
    assert plan.ranges == (OffsetRange(topic, 0, offsets[3], offsets[5] + 1),)

    bounded = metadata.plan(source, {}, max_records_per_partition=100, interval_end_ms=base + 4000)
    assert bounded.ranges == (OffsetRange(topic, 0, offsets[3], offsets[4]),)
    records = list(read_range(bootstrap, bounded.ranges[0]))
    assert [r.timestamp for r in records] == [base + 3000]

    # An interval ending after every record is bounded by the LSO; one already read is an empty range.
    later = metadata.plan(
        KafkaSource(topics=(topic,)), {}, max_records_per_partition=100, interval_end_ms=base + 10**7
    )
    assert later.ranges == (OffsetRange(topic, 0, 0, offsets[5] + 1),)
    done = metadata.plan(
        source, {(topic, 0): offsets[5]}, max_records_per_partition=100, interval_end_ms=base + 1
    )
    assert done.ranges == (OffsetRange(topic, 0, offsets[5], offsets[5]),)
    # A timestamp after the last record starts a new pipeline at the end.
    future = metadata.plan(
        KafkaSource(topics=(topic,), starting=base + 10**7), {}, max_records_per_partition=100
    )
    assert future.ranges == (OffsetRange(topic, 0, offsets[5] + 1, offsets[5] + 1),)


def test_offsets_deleted_by_retention_fail_the_plan_or_are_skipped(
    bootstrap: str, make_topic: Callable[..., str], metadata: KafkaMetadata, kafka_admin: Any
) -> None:
    topic = make_topic("src-retention")
    writer = Writer(bootstrap, topic)
    writer.send(*(f"r{i}".encode() for i in range(10)))
    for future in kafka_admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(timeout=30)
    committed = {(topic, 0): 2}

    with pytest.raises(OffsetsLost) as lost:
        metadata.plan(KafkaSource(topics=(topic,)), committed, max_records_per_partition=100)
    assert (lost.value.topic, lost.value.partition) == (topic, 0)
    assert (lost.value.planned_offset, lost.value.earliest_offset) == (2, 4)
    assert f"{topic}[0]" in str(lost.value) and "skip" in str(lost.value)

    skipping = KafkaSource(topics=(topic,), on_missing_offsets="skip")
    plan = metadata.plan(skipping, committed, max_records_per_partition=100)
    assert plan.ranges == (OffsetRange(topic, 0, 4, 10),)
    assert [(s.planned_from, s.earliest, s.count) for s in plan.skipped] == [(2, 4, 2)]
    assert values(list(read_range(bootstrap, plan.ranges[0]))) == [f"r{i}".encode() for i in range(4, 10)]

    # The reader refuses a range whose start is gone, rather than jumping to what is left.
    with pytest.raises(OffsetsLost) as read_lost:
        list(read_range(bootstrap, OffsetRange(topic, 0, 2, 10)))
    assert read_lost.value.earliest_offset == 4


def test_partitions_added_to_a_topic_are_planned_from_their_start(
    bootstrap: str, make_topic: Callable[..., str], metadata: KafkaMetadata, kafka_admin: Any
) -> None:
    topic = make_topic("src-grow")
    writer = Writer(bootstrap, topic)
    writer.send(b"p0-a", b"p0-b")
    source = KafkaSource(topics=(topic,), starting="latest")
    first = metadata.plan(source, {}, max_records_per_partition=100)
    assert first.ranges == (OffsetRange(topic, 0, 2, 2),)

    kafka_admin.create_partitions([NewPartitions(topic, 3)])[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while len(metadata.partitions([topic])) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    grown = Writer(bootstrap, topic)  # a fresh producer, whose metadata knows the new partitions
    grown.send(b"p2-a", partition=2)
    grown.send(b"p0-c", partition=0)

    second = metadata.plan(source, first.positions(), max_records_per_partition=100)
    assert second.ranges == (
        OffsetRange(topic, 0, 2, 3),
        OffsetRange(topic, 1, 0, 0),
        OffsetRange(topic, 2, 0, 1),
    )
    assert values(list(read_range(bootstrap, second.ranges[2]))) == [b"p2-a"]
    slices = assign_slices(second.ranges, slices=2, max_records_per_task=10)
    assert sorted(r for s in slices for r in s.ranges) == sorted(second.ranges)


def test_missing_topic_and_unreachable_broker_are_named(metadata: KafkaMetadata) -> None:
    missing = f"src-missing-{uuid.uuid4().hex[:10]}"
    with pytest.raises(TopicNotFound, match=missing):
        metadata.partitions([missing])
    with (
        KafkaMetadata("127.0.0.1:1", timeout_s=2) as nowhere,
        pytest.raises(ServiceUnavailable, match=re.escape("127.0.0.1:1")),
    ):
        nowhere.partitions(["anything"])
