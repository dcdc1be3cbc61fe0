"""Read exactly the committed records of one partition's ``[from, until)``: the resettable source.

Offsets bound the read, never a count: transaction markers and records of aborted transactions occupy
offsets that a read_committed consumer never receives, so the reader stops when the consumer's *position*
reaches ``until`` (the position moves past skipped offsets even when nothing is delivered). Replaying a
range gives the same records, because everything below the last stable offset is decided for good.

The consumer is assigned the partition directly (no group, nothing committed to Kafka): the ledger, not
the consumer group, owns the positions.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

from onceflow.decoding.records import KafkaRecord
from onceflow.offsets import OffsetRange
from onceflow.sources.errors import OffsetsLost, RangeReadError, RangeReadTimeout, SkippedOffsets
from onceflow.sources.kafka_clients import kafka_config


def read_range(bootstrap: str, offset_range: OffsetRange, **options: Any) -> Iterator[KafkaRecord]:
    """Yield the committed records with ``from_offset <= offset < until_offset``, in offset order
    (``options``: `read_range_batches`'s).

    Raises `RangeReadTimeout` when the position does not advance for ``stall_timeout_s`` seconds of
    polling (time the caller spends between records does not count), and `OffsetsLost` when retention
    deleted the start of the range.
    """
    for batch in read_range_batches(bootstrap, offset_range, **options):
        yield from batch.records()


def read_range_batches(
    bootstrap: str,
    offset_range: OffsetRange,
    *,
    batch_size: int = 500,
    poll_timeout_s: float = 0.1,
    stall_timeout_s: float = 60.0,
    config: Mapping[str, Any] | None = None,
) -> Iterator[Fetched]:
    """`read_range` as what each fetch delivers (up to ``batch_size`` records, never none), for a reader
    that decodes a batch at a time."""
    if batch_size < 1 or poll_timeout_s <= 0 or stall_timeout_s <= 0:
        raise ValueError("batch_size, poll_timeout_s and stall_timeout_s must be positive")
    if offset_range.is_empty:
        return
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        kafka_config(
            bootstrap,
            {
                "group.id": "onceflow-range-reader",  # required by the client; no group is ever joined
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "error",  # a deleted start is an error, never a silent jump
                "enable.partition.eof": True,
                **prefetch_config(offset_range),
                **(config or {}),
            },
        )
    )
    topic, partition, until = offset_range.topic, offset_range.partition, offset_range.until_offset
    try:
        consumer.assign([TopicPartition(topic, partition, offset_range.from_offset)])
        position = offset_range.from_offset
        stalled_s = 0.0
        while True:
            started = time.monotonic()
            # Never ask for more records than offsets remain: the call then returns as soon as they are
            # fetched, instead of waiting out its timeout at the end of every range.
            wanted = max(1, min(batch_size, until - max(position, offset_range.from_offset)))
            messages = consumer.consume(num_messages=wanted, timeout=poll_timeout_s)
            polled_s = time.monotonic() - started
            # Most fetches hold records only: their errors and offsets are read in one pass each.
            good = messages
            if any(message.error() is not None for message in messages):
                good = []
                for message in messages:
                    error = message.error()
                    if error is None:
                        good.append(message)
                    elif error.code() == KafkaError._PARTITION_EOF:
                        continue
                    elif error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                        raise OffsetsLost((SkippedOffsets(topic, partition, position, low),))
                    else:
                        raise RangeReadError(f"reading {offset_range} failed at offset {position}: {error}")
            found: list[int | None] = [message.offset() for message in good]
            if None in found:
                raise RangeReadError(f"reading {offset_range}: a record without an offset")
            offsets = cast(list[int], found)
            within = bisect_left(offsets, until)  # a partition's offsets only grow
            reached_end = within < len(good)
            batch = Fetched(topic, partition, good[:within], offsets[:within], TIMESTAMP_NOT_AVAILABLE)
            if batch:
                yield batch
            current = _position(consumer, TopicPartition(topic, partition))
            if reached_end or current >= until:
                return
            if current > position or batch:
                position = max(position, current)
                stalled_s = 0.0
            else:
                stalled_s += polled_s
                if stalled_s >= stall_timeout_s:
                    raise RangeReadTimeout(
                        f"reading {offset_range} from {bootstrap}: stuck at offset {position} for "
                        f"{stalled_s:.0f}s (an open transaction below {until}, or the topic was recreated?)"
                    )
    finally:
        consumer.close()


# The most a range reader keeps fetched ahead of what it has delivered (librdkafka's default is 64 MB
# per partition), so that a Python worker's memory does not follow the topic's size.
PREFETCH_KBYTES = 16384
# How long the client waits before its next fetch once the queue is at either bound. librdkafka's
# default is 1 s: a range longer than the bounds (100,000 records, or 16 MB: 16,000 records of 1 KB)
# was read in bursts with a second's pause after each, 4.9 µs a record against 1.2 µs.
QUEUE_BACKOFF_MS = 10


def prefetch_config(offset_range: OffsetRange) -> dict[str, int]:
    """How far ahead the consumer fetches: librdkafka keeps up to 100,000 records per partition queued
    by default, whatever follows the range, so a read task of a long partition fetched and decompressed
    up to twice its range (and held it). A range needs no record past its end. (Only a range with
    offsets gets here.)"""
    wanted = offset_range.until_offset - offset_range.from_offset
    return {
        "queued.min.messages": min(100_000, wanted),
        "queued.max.messages.kbytes": PREFETCH_KBYTES,
        "fetch.queue.backoff.ms": QUEUE_BACKOFF_MS,
    }


class Fetched:
    """The records of one partition that one or more fetches delivered, in offset order, kept as the
    client's messages: a reader that takes columns reads each from them (`values`, `keys`, ...) without
    an object per record, and `records` makes the records where one is needed."""

    __slots__ = ("_no_timestamp", "_offsets", "messages", "partition", "topic")

    def __init__(
        self, topic: str, partition: int, messages: list[Any], offsets: list[int], no_timestamp: int
    ) -> None:
        self.topic, self.partition = topic, partition
        self.messages, self._offsets, self._no_timestamp = messages, offsets, no_timestamp

    @classmethod
    def joined(cls, batches: Iterable[Fetched]) -> Fetched:
        """Consecutive batches of one partition as one."""
        batches = list(batches)
        first = batches[0]
        messages = [m for b in batches for m in b.messages]
        offsets = [o for b in batches for o in b._offsets]
        return cls(first.topic, first.partition, messages, offsets, first._no_timestamp)

    def __len__(self) -> int:
        return len(self.messages)

    def offsets(self) -> list[int]:
        return self._offsets

    def values(self) -> list[bytes | None]:
        return [m.value() for m in self.messages]

    def keys(self) -> list[bytes | None]:
        return [m.key() for m in self.messages]

    def timestamps(self) -> list[int | None]:
        """In ms; None where the broker has none."""
        none = self._no_timestamp
        return [None if kind == none else at for kind, at in (m.timestamp() for m in self.messages)]

    def records(self) -> list[KafkaRecord]:
        return [_record(m, self._no_timestamp) for m in self.messages]


def _position(consumer: Any, partition: Any) -> int:
    """The consumer's next offset to deliver; negative (unknown) until the first fetch."""
    positions = consumer.position([partition])
    return int(positions[0].offset)


def _record(message: Any, no_timestamp: int) -> KafkaRecord:
    """The record of a consumed message (``no_timestamp``: the client's TIMESTAMP_NOT_AVAILABLE, looked
    up once per range: this runs for every record)."""
    timestamp_type, timestamp = message.timestamp()
    headers = message.headers()
    # tuple.__new__ with the seven fields in order: a named tuple's own constructor, a Python function,
    # took as long again.
    return tuple.__new__(
        KafkaRecord,
        (
            message.topic(),
            message.partition(),
            message.offset(),
            None if timestamp_type == no_timestamp else timestamp,
            message.key(),
            message.value(),
            tuple((str(name), value) for name, value in headers) if headers else (),
        ),
    )
