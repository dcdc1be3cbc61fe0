"""Epoch planning rules, as properties over arbitrary positions, watermarks and limits."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.offsets import OffsetRange
from onceflow.sources.errors import OffsetsLost, PlanningError
from onceflow.sources.kafka_planning import (
    PartitionOffsets,
    TopicPartitionKey,
    assign_slices,
    plan_ranges,
    topics_without_positions,
)


@st.composite
def partition_states(draw: st.DrawFn) -> tuple[list[PartitionOffsets], dict[TopicPartitionKey, int]]:
    """Partitions of up to three topics, and committed positions for some of them (never lost ones)."""
    parts = []
    committed = {}
    for topic in draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True)):
        for partition in range(draw(st.integers(1, 4))):
            low = draw(st.integers(0, 50))
            stable = low + draw(st.integers(0, 200))
            parts.append(PartitionOffsets(topic, partition, low, stable))
            if draw(st.booleans()):
                committed[(topic, partition)] = draw(st.integers(low, stable))
    return parts, committed


limits = st.integers(1, 120)


@given(partition_states(), limits, st.sampled_from(["earliest", "latest"]))
def test_ranges_resume_at_positions_stay_below_lso_and_respect_the_maximum(
    state: tuple[list[PartitionOffsets], dict[TopicPartitionKey, int]], maximum: int, starting: str
) -> None:
    parts, committed = state
    plan = plan_ranges(parts, committed, starting=starting, max_records_per_partition=maximum)  # type: ignore[arg-type]
    by_key = {(r.topic, r.partition): r for r in plan.ranges}
    assert sorted(by_key) == sorted(p.key for p in parts)
    with_positions = {topic for topic, _ in committed}
    backlog = 0
    for part in parts:
        r = by_key[part.key]
        if part.key in committed:
            assert r.from_offset == committed[part.key]
        elif part.topic in with_positions:
            assert r.from_offset == part.low
        else:
            assert r.from_offset == (part.low if starting == "earliest" else part.stable)
        assert r.until_offset <= part.stable
        assert r.span <= maximum
        # As far as possible: either to the LSO, or exactly the maximum.
        assert r.until_offset == part.stable or r.span == maximum
        backlog += part.stable - r.until_offset
    assert plan.backlog == backlog
    # The next epoch starts exactly where this one ends.
    follow = plan_ranges(parts, plan.positions(), starting=starting, max_records_per_partition=maximum)  # type: ignore[arg-type]
    assert [r.from_offset for r in follow.ranges] == [r.until_offset for r in plan.ranges]


@given(partition_states(), limits, st.data())
def test_interval_end_bounds_ranges_but_never_beyond_lso_or_behind_the_position(
    state: tuple[list[PartitionOffsets], dict[TopicPartitionKey, int]], maximum: int, data: st.DataObject
) -> None:
    parts, committed = state
    ends = {p.key: data.draw(st.integers(-1, p.stable + 50)) for p in parts}
    plan = plan_ranges(
        parts, committed, starting="earliest", max_records_per_partition=maximum, end_offsets=ends
    )
    for part, r in zip(sorted(parts), plan.ranges, strict=True):
        target = part.stable if ends[part.key] < 0 else min(ends[part.key], part.stable)
        assert r.from_offset == committed.get(part.key, part.low)
        assert r.until_offset == max(r.from_offset, min(target, r.from_offset + maximum))


@given(
    st.lists(st.tuples(st.sampled_from("xyz"), st.integers(0, 5), st.integers(0, 100), st.integers(0, 40))),
    st.integers(1, 6),
    st.integers(1, 25),
)
def test_slices_partition_the_partitions_and_tasks_tile_each_range(
    raw: list[tuple[str, int, int, int]], slices: int, per_task: int
) -> None:
    unique = {(t, p): OffsetRange(t, p, start, start + span) for t, p, start, span in raw}
    ranges = list(unique.values())
    plans = assign_slices(ranges, slices, per_task)
    assert [s.slice for s in plans] == list(range(slices))
    owned = [(r.topic, r.partition) for s in plans for r in s.ranges]
    assert sorted(owned) == sorted(unique)  # every partition in exactly one slice
    sizes = [len(s.ranges) for s in plans]
    assert max(sizes) - min(sizes) <= 1
    task_ids = [t.task_id for s in plans for t in s.tasks]
    assert len(set(task_ids)) == len(task_ids)
    for s in plans:
        assert [t.task_id for t in s.tasks] == [f"s{s.slice}-t{i}" for i in range(len(s.tasks))]
        for r in s.ranges:
            pieces = [
                t.range for t in s.tasks if (t.range.topic, t.range.partition) == (r.topic, r.partition)
            ]
            assert all(t.slice == s.slice for t in s.tasks)
            if r.is_empty:
                assert pieces == []
                continue
            assert pieces[0].from_offset == r.from_offset and pieces[-1].until_offset == r.until_offset
            assert all(a.until_offset == b.from_offset for a, b in itertools.pairwise(pieces))
            assert all(0 < p.span <= per_task for p in pieces)
    # Deterministic: the same ranges in any order give the same plan.
    assert assign_slices(list(reversed(ranges)), slices, per_task) == plans


def test_lost_offsets_fail_with_every_lost_partition_named() -> None:
    parts = [PartitionOffsets("t", 0, 10, 20), PartitionOffsets("t", 1, 5, 9), PartitionOffsets("t", 2, 0, 9)]
    committed = {("t", 0): 4, ("t", 1): 7, ("t", 2): 0}
    with pytest.raises(OffsetsLost) as lost:
        plan_ranges(parts, committed, starting="earliest", max_records_per_partition=100)
    assert (
        lost.value.topic,
        lost.value.partition,
        lost.value.planned_offset,
        lost.value.earliest_offset,
    ) == (
        "t",
        0,
        4,
        10,
    )
    assert [(g.partition, g.count) for g in lost.value.lost] == [(0, 6)]
    assert "t[0]: planned offset 4, earliest available 10" in str(lost.value)


def test_skip_policy_starts_at_the_low_watermark_and_reports_the_gap() -> None:
    parts = [PartitionOffsets("t", 0, 10, 20), PartitionOffsets("t", 1, 0, 3)]
    plan = plan_ranges(
        parts,
        {("t", 0): 4, ("t", 1): 1},
        starting="earliest",
        max_records_per_partition=6,
        on_missing_offsets="skip",
    )
    assert plan.ranges == (OffsetRange("t", 0, 10, 16), OffsetRange("t", 1, 1, 3))
    assert [(g.topic, g.partition, g.planned_from, g.earliest, g.count) for g in plan.skipped] == [
        ("t", 0, 4, 10, 6)
    ]
    assert plan.backlog == 4


def test_timestamp_start_applies_to_topics_without_positions_only() -> None:
    parts = [
        PartitionOffsets("new", 0, 0, 50),
        PartitionOffsets("new", 1, 10, 20),
        PartitionOffsets("old", 0, 0, 9),
    ]
    assert topics_without_positions(["new", "old"], {("old", 0): 3}) == ["new"]
    plan = plan_ranges(
        parts,
        {("old", 0): 3},
        starting=1_700_000_000_000,
        max_records_per_partition=100,
        start_offsets={("new", 0): 30, ("new", 1): -1},
    )
    assert plan.ranges == (
        OffsetRange("new", 0, 30, 50),
        OffsetRange("new", 1, 20, 20),
        OffsetRange("old", 0, 3, 9),
    )
    with pytest.raises(PlanningError, match=r"new\[1\]: no offset for the starting timestamp"):
        plan_ranges(parts, {}, starting=5, max_records_per_partition=1, start_offsets={("new", 0): 1})


def test_contradictions_between_ledger_and_kafka_are_errors() -> None:
    parts = [PartitionOffsets("t", 0, 0, 10)]
    with pytest.raises(
        PlanningError, match=r"t\[0\]: committed position 11 is beyond the last stable offset 10"
    ):
        plan_ranges(parts, {("t", 0): 11}, starting="earliest", max_records_per_partition=5)
    with pytest.raises(PlanningError, match=r"no longer exist: \[\('t', 3\)\]"):
        plan_ranges(parts, {("t", 0): 1, ("t", 3): 1}, starting="earliest", max_records_per_partition=5)
    with pytest.raises(PlanningError, match="no offset for the data interval end"):
        plan_ranges(parts, {}, starting="earliest", max_records_per_partition=5, end_offsets={})
    # Positions of topics the source no longer reads do not matter.
    plan = plan_ranges(parts, {("gone", 0): 7}, starting="latest", max_records_per_partition=5)
    assert plan.ranges == (OffsetRange("t", 0, 10, 10),)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_records_per_partition": 0}, "max_records_per_partition=0"),
        ({"max_records_per_partition": 1, "on_missing_offsets": "ignore"}, "on_missing_offsets='ignore'"),
    ],
)
def test_bad_planning_arguments_are_named(kwargs: Mapping[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_ranges([], {}, starting="earliest", **kwargs)  # type: ignore[arg-type]


def test_bad_slicing_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="slices=0"):
        assign_slices([], 0, 1)
    with pytest.raises(ValueError, match="max_records_per_task=0"):
        assign_slices([], 1, 0)
    with pytest.raises(PlanningError, match="one range per partition"):
        assign_slices([OffsetRange("t", 0, 0, 1), OffsetRange("t", 0, 1, 2)], 1, 1)
