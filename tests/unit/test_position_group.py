"""Which consumer group a commit keeps in step with the ledger, and when it must leave it alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.config import Settings
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.protocol.positions import group_to_publish


def _spec(*sinks: SinkSpec) -> Pipeline:
    return Pipeline("clicks", KafkaSource(("in",)), JsonFormat({"n": "int"}), sinks)


def _kafka(name: str, **extra: str) -> SinkSpec:
    return SinkSpec(name, "kafka", {"topic": "out", "staging_root": "/tmp/staging", **extra})


@pytest.mark.parametrize(
    ("sinks", "group"),
    [
        ((SinkSpec("db", "postgres_2pc", {"table": "t", "columns": {"n": "bigint"}}),), "onceflow-clicks"),
        # The Kafka sink commits onceflow-clicks inside its output transaction: nobody else may write it.
        ((_kafka("out"),), None),
        ((_kafka("out", group_id="clicks-published"),), "onceflow-clicks"),
    ],
)
def test_the_position_group_is_onceflow_pipeline_unless_a_kafka_sink_owns_it(
    tmp_path: Path, sinks: tuple[SinkSpec, ...], group: str | None
) -> None:
    settings = Settings(tmp_path, "127.0.0.1:1", "postgresql://u@127.0.0.1:1/db", "sqlite://", 60.0)
    assert group_to_publish(_spec(*sinks), settings) == group
