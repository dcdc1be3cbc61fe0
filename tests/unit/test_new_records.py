"""New records beyond the committed position, and when an event-driven DAG announces them."""

from __future__ import annotations

from onceflow.monitoring.new_records import (
    Announced,
    Backlog,
    PartitionBacklog,
    backlog_of,
    describe,
    should_announce,
)
from onceflow.pipeline import KafkaSource
from onceflow.sources.kafka_planning import PartitionOffsets

SOURCE = KafkaSource(topics=("clicks",))


def _parts(*stable: int, low: int = 0) -> list[PartitionOffsets]:
    return [PartitionOffsets("clicks", i, low, s) for i, s in enumerate(stable)]


def test_backlog_counts_offsets_between_the_committed_position_and_the_last_stable_offset() -> None:
    backlog = backlog_of("clicks", SOURCE, _parts(10, 4), {("clicks", 0): 7, ("clicks", 1): 4})
    assert [(p.partition, p.position, p.stable, p.lag) for p in backlog.partitions] == [
        (0, 7, 10, 3),
        (1, 4, 4, 0),
    ]
    assert backlog.records == 3
    assert backlog.has_work
    assert describe(backlog) == "pipeline 'clicks': 3 new offsets (clicks[0] 7..10)"


def test_caught_up_pipeline_has_no_work() -> None:
    backlog = backlog_of("clicks", SOURCE, _parts(10, 4), {("clicks", 0): 10, ("clicks", 1): 4})
    assert backlog.records == 0
    assert not backlog.has_work


def test_a_topic_never_read_starts_where_the_plan_would_start() -> None:
    earliest = backlog_of("clicks", SOURCE, _parts(5, 2, low=1), {})
    assert earliest.records == 4 + 1
    assert earliest.unstarted == ("clicks",)
    # "latest" has nothing to read yet, but the first epoch must run to fix the starting position.
    latest = backlog_of("clicks", KafkaSource(topics=("clicks",), starting="latest"), _parts(5), {})
    assert latest.records == 0
    assert latest.has_work
    # A partition added after the pipeline started is read from its beginning.
    added = backlog_of("clicks", SOURCE, _parts(10, 3), {("clicks", 0): 10})
    assert added.records == 3
    assert not added.unstarted


def test_offsets_deleted_by_retention_are_not_counted() -> None:
    backlog = backlog_of("clicks", SOURCE, _parts(20, low=15), {("clicks", 0): 10})
    assert backlog.records == 5


def _backlog(position: int, stable: int, in_flight: int | None = None) -> Backlog:
    return Backlog("clicks", (PartitionBacklog("clicks", 0, position, stable),), (), in_flight)


def test_announce_once_per_new_state() -> None:
    first = _backlog(0, 5)
    assert should_announce(first, None, 0.0, 300.0)
    seen = Announced(first.state, 0.0)
    # The same records while their run is queued or running: no second event.
    assert not should_announce(_backlog(0, 5, in_flight=1), seen, 10.0, 300.0)
    assert not should_announce(first, seen, 10.0, 300.0)
    # More records arrive during the run: one event, for the run after it.
    assert should_announce(_backlog(0, 8, in_flight=1), seen, 11.0, 300.0)
    # The run committed part of them (max records per partition): what is left is announced.
    assert should_announce(_backlog(5, 8), Announced(_backlog(0, 8).state, 11.0), 12.0, 300.0)
    # Caught up: nothing, whatever the last event was.
    assert not should_announce(_backlog(8, 8), Announced(_backlog(5, 8).state, 12.0), 999.0, 300.0)


def test_unchanged_records_are_announced_again_after_repeat_s_when_no_epoch_is_in_flight() -> None:
    seen = Announced(_backlog(0, 5).state, 100.0)
    assert not should_announce(_backlog(0, 5), seen, 399.0, 300.0)
    assert should_announce(_backlog(0, 5), seen, 400.0, 300.0)  # e.g. the run aborted
    assert not should_announce(_backlog(0, 5, in_flight=2), seen, 400.0, 300.0)
