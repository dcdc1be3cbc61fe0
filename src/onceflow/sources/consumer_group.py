"""A pipeline's committed position as the Kafka consumer group ``onceflow-<pipeline>``.

The ledger is the source of truth for where a pipeline stands; Kafka's own tools (``kafka-consumer-groups``,
Burrow, lag exporters) only look at consumer groups. So after each committed epoch the coordinator writes
the ledger's positions to this group: a copy for those tools, never read back to plan. A pipeline whose
Kafka sink commits the input offsets to the same group inside its output transaction already has them
there, exactly as published.

The group is written with an admin request, without joining it (Kafka allows that for a group with no
live members), and every call is bounded in time; `onceflow status` compares the group with the ledger
and reports a difference.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from onceflow.errors import ServiceUnavailable
from onceflow.names import check_name
from onceflow.sources.kafka_clients import kafka_config, kafka_error_text

TopicPartitionKey = tuple[str, int]


def position_group(pipeline: str) -> str:
    """The consumer group that shows ``pipeline``'s position: ``onceflow-<pipeline>``."""
    return f"onceflow-{check_name('pipeline', pipeline)}"


def _consumer(bootstrap: str, group: str, timeout_s: float) -> Any:
    from confluent_kafka import Consumer

    settings = {"group.id": group, "enable.auto.commit": False, "socket.timeout.ms": int(timeout_s * 1000)}
    return Consumer(kafka_config(bootstrap, settings))


def publish_positions(
    bootstrap: str, group: str, positions: Mapping[TopicPartitionKey, int], *, timeout_s: float = 5.0
) -> None:
    """Set ``group``'s offsets to ``positions`` (the next offset to read, per partition), within
    ``timeout_s`` whatever the broker does: an admin request, not a consumer's unbounded commit."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient

    if not positions:
        return
    admin = AdminClient(kafka_config(bootstrap, {"socket.timeout.ms": int(timeout_s * 1000)}))
    offsets = [TopicPartition(t, p, offset) for (t, p), offset in sorted(positions.items())]
    request = [ConsumerGroupTopicPartitions(group, offsets)]
    try:
        done = admin.alter_consumer_group_offsets(request, request_timeout=timeout_s)[group].result()
    except KafkaException as exc:
        raise ServiceUnavailable(
            f"Kafka at {bootstrap} did not take the offsets of consumer group {group!r} "
            f"({kafka_error_text(exc)})"
        ) from exc
    failed = [tp for tp in done.topic_partitions or [] if tp.error]
    if failed:
        raise ServiceUnavailable(
            f"Kafka at {bootstrap} refused the offsets of consumer group {group!r} for "
            + ", ".join(f"{tp.topic}[{tp.partition}] ({tp.error})" for tp in failed)
        )


def group_positions(
    bootstrap: str, group: str, partitions: Iterable[TopicPartitionKey], *, timeout_s: float = 10.0
) -> dict[TopicPartitionKey, int | None]:
    """``group``'s committed offset of each partition, None where it has none."""
    from confluent_kafka import TopicPartition

    wanted = [TopicPartition(t, p) for t, p in sorted(set(partitions))]
    if not wanted:
        return {}
    consumer = _consumer(bootstrap, group, timeout_s)
    try:
        found = consumer.committed(wanted, timeout=timeout_s)
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None for tp in found}
