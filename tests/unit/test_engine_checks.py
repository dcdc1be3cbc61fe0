"""Plan-time checks and participants of the engine, without services."""

from __future__ import annotations

import pytest

from onceflow.config import Settings
from onceflow.errors import ConfigError
from onceflow.offsets import OffsetRange
from onceflow.pipeline import STATE_SINK, JsonFormat, KafkaSource, Pipeline, SinkSpec, StateSpec
from onceflow.protocol.planning import (
    check_guarantee,
    check_rerun,
    expected_participants,
    participant_sinks,
    run_plan_checks,
    slices_of,
)

KAFKA = {"topic": "out", "bootstrap": "127.0.0.1:1", "staging_root": "/tmp/x"}
SETTINGS = Settings.from_env({})


def spec(*sinks: SinkSpec, **fields: object) -> Pipeline:
    return Pipeline(
        name="p",
        source=KafkaSource(topics=("in",)),
        format=JsonFormat(schema={"n": "int"}),
        sinks=sinks,
        **fields,  # type: ignore[arg-type]
    )


def test_two_kafka_sinks_sharing_a_consumer_group_are_refused() -> None:
    shared = spec(SinkSpec("a", "kafka", KAFKA), SinkSpec("b", "kafka", {**KAFKA, "topic": "other"}))
    with pytest.raises(ConfigError, match="sinks 'a' and 'b' both commit input offsets to consumer group"):
        run_plan_checks(shared, SETTINGS)
    run_plan_checks(
        spec(SinkSpec("a", "kafka", KAFKA), SinkSpec("b", "kafka", {**KAFKA, "group_id": "g-b"})), SETTINGS
    )


def test_a_kafka_transaction_timeout_below_the_pipeline_timeout_is_refused() -> None:
    short = spec(
        SinkSpec("a", "kafka", {**KAFKA, "transaction_timeout_ms": 60_000}), transaction_timeout_s=900
    )
    with pytest.raises(ConfigError, match=r"sink 'a'.*Raise transaction_timeout_ms"):
        run_plan_checks(short, SETTINGS)


def test_state_is_a_participant_of_every_task(tmp_path: object) -> None:
    stateful = spec(
        SinkSpec("pg", "postgres_upsert", {"table": "t", "columns": {"k": "text"}, "key_columns": ["k"]}),
        state=StateSpec(keys=("k",), reducer="count", root="/tmp/state"),
        max_records_per_task=5,
    )
    slices = slices_of(stateful, (OffsetRange("in", 0, 0, 12),))
    assert expected_participants(stateful, slices) == [
        (name, task) for task in ("s0-t0", "s0-t1", "s0-t2") for name in ("pg", STATE_SINK)
    ]
    state = participant_sinks(stateful, SETTINGS)[-1]
    assert state.name == STATE_SINK and state.kind == "files"
    assert dict(state.config) == {"root": "/tmp/state/p", "table": "state", "mode": "replace"}


def test_replacing_an_interval_is_refused_for_append_only_sinks_at_plan_time() -> None:
    appending = spec(SinkSpec("out", "kafka", KAFKA), on_rerun="replace")
    with pytest.raises(ConfigError, match=r"on_rerun='replace': sinks \['out \(kafka\)'\] are append-only"):
        run_plan_checks(appending, SETTINGS)
    check_rerun(spec(SinkSpec("t", "files", {"root": "/tmp/x", "table": "t"}), on_rerun="replace"))


def test_exactly_once_refuses_sinks_that_write_before_the_commit() -> None:
    plain = SinkSpec("log", "plain", {"table": "t", "columns": {"n": "bigint"}})
    with pytest.raises(ConfigError, match=r"declares exactly_once, but sinks \['log'\] only give at-least"):
        check_guarantee(spec(plain))
    check_guarantee(spec(plain, guarantee="at_least_once"))


def test_at_most_once_takes_only_direct_sinks_and_waits_for_no_participant() -> None:
    plain = SinkSpec("log", "plain", {"table": "t", "columns": {"n": "bigint"}})
    staged = SinkSpec("pg", "postgres_2pc", {"table": "t", "columns": {"n": "bigint"}})
    at_most_once = spec(plain, guarantee="at_most_once")
    check_guarantee(at_most_once)
    with pytest.raises(ConfigError, match=r"sinks \['pg'\] stage their output"):
        check_guarantee(spec(plain, staged, guarantee="at_most_once"))
    slices = slices_of(at_most_once, (OffsetRange("in", 0, 0, 12),))
    assert slices[0].tasks and expected_participants(at_most_once, slices) == []
