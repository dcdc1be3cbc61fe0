"""The I/O half of planning: ask Kafka for partitions, watermarks and offsets for timestamps.

Kept thin so that every decision stays in `onceflow.sources.kafka_planning`. The consumer reads with
``isolation.level=read_committed``: its high watermark is then the last stable offset, the end of what
an epoch may plan. Every call has a timeout, and a broker that does not answer becomes a
`ServiceUnavailable` naming the bootstrap address.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from onceflow.errors import ServiceUnavailable
from onceflow.pipeline import KafkaSource
from onceflow.sources.errors import PlanningError, TopicNotFound
from onceflow.sources.kafka_clients import kafka_config, kafka_error_text
from onceflow.sources.kafka_planning import (
    EpochPlan,
    PartitionOffsets,
    TopicPartitionKey,
    plan_ranges,
    topics_without_positions,
)

_T = TypeVar("_T")


class KafkaMetadata:
    """A short-lived read_committed consumer used only for metadata; it never joins a group."""

    def __init__(
        self, bootstrap: str, *, timeout_s: float = 15.0, config: Mapping[str, Any] | None = None
    ) -> None:
        from confluent_kafka import Consumer

        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._consumer = Consumer(
            kafka_config(
                bootstrap,
                {
                    "group.id": "onceflow-metadata",  # required by the client; no group is ever joined
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "socket.timeout.ms": int(timeout_s * 1000),
                    **(config or {}),
                },
            )
        )

    def __enter__(self) -> KafkaMetadata:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._consumer.close()

    def _call(self, what: str, request: Callable[[], _T]) -> _T:
        """Run a metadata request, retrying errors Kafka calls retriable (a partition just created has no
        leader for a moment) until ``timeout_s`` has passed."""
        from confluent_kafka import KafkaError, KafkaException

        leader_moving = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE}
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return request()
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                retriable = isinstance(error, KafkaError) and (
                    error.retriable() or error.code() in leader_moving
                )
                if not retriable or time.monotonic() >= deadline:
                    raise ServiceUnavailable(
                        f"Kafka at {self.bootstrap} did not answer {what} within {self.timeout_s:g}s "
                        f"({kafka_error_text(exc)}): check ONCEFLOW_KAFKA_BOOTSTRAP (or the onceflow_kafka "
                        "connection) and that the brokers are running"
                    ) from exc
                time.sleep(0.2)

    def partitions(self, topics: Iterable[str]) -> list[PartitionOffsets]:
        """Every current partition of ``topics`` with its low watermark and last stable offset."""
        from confluent_kafka import TopicPartition

        metadata = self._call(
            "a metadata request", lambda: self._consumer.list_topics(timeout=self.timeout_s)
        )
        result = []
        for topic in sorted(set(topics)):
            described = metadata.topics.get(topic)
            if described is None or described.error is not None:
                detail = "" if described is None else f" ({described.error})"
                raise TopicNotFound(f"topic {topic!r} does not exist on Kafka at {self.bootstrap}{detail}")
            for partition in sorted(described.partitions):
                query = TopicPartition(topic, partition)
                low, stable = self._call(
                    f"watermarks of {topic}[{partition}]",
                    partial(
                        self._consumer.get_watermark_offsets, query, timeout=self.timeout_s, cached=False
                    ),
                )
                result.append(PartitionOffsets(topic, partition, low, stable))
        return result

    def offsets_for_times(
        self, keys: Iterable[TopicPartitionKey], timestamp_ms: int
    ) -> dict[TopicPartitionKey, int]:
        """The first offset at or after ``timestamp_ms`` per partition; -1 when there is none yet."""
        from confluent_kafka import TopicPartition

        query = [TopicPartition(topic, partition, timestamp_ms) for topic, partition in sorted(set(keys))]
        if not query:
            return {}
        answers = self._call(
            f"offsets for timestamp {timestamp_ms}",
            lambda: self._consumer.offsets_for_times(query, timeout=self.timeout_s),
        )
        result = {}
        for answer in answers:
            if answer.error is not None:
                raise PlanningError(
                    f"{answer.topic}[{answer.partition}]: offset for timestamp {timestamp_ms} failed: "
                    f"{answer.error}"
                )
            result[(answer.topic, answer.partition)] = answer.offset
        return result

    def plan(
        self,
        source: KafkaSource,
        committed: Mapping[TopicPartitionKey, int],
        *,
        max_records_per_partition: int,
        interval_end_ms: int | None = None,
    ) -> EpochPlan:
        """Plan the next epoch of ``source`` from committed positions, optionally up to an interval end."""
        partitions = self.partitions(source.topics)
        start_offsets = None
        if isinstance(source.starting, int):
            fresh = set(topics_without_positions(source.topics, committed))
            start_offsets = self.offsets_for_times(
                (p.key for p in partitions if p.topic in fresh), source.starting
            )
        end_offsets = None
        if interval_end_ms is not None:
            end_offsets = self.offsets_for_times((p.key for p in partitions), interval_end_ms)
        return plan_ranges(
            partitions,
            committed,
            starting=source.starting,
            max_records_per_partition=max_records_per_partition,
            on_missing_offsets=source.on_missing_offsets,
            start_offsets=start_offsets,
            end_offsets=end_offsets,
        )
