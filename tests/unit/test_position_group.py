"""Which consumer group the coordinator keeps in step with the ledger, and when it must leave it alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.config import Settings
from onceflow.coordinator import Coordinator
from onceflow.ledger import Ledger
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec


def _spec(*sinks: SinkSpec) -> Pipeline:
    return Pipeline("clicks", KafkaSource(("in",)), JsonFormat({"n": "int"}), sinks)


def _kafka(name: str, **extra: str) -> SinkSpec:
    return SinkSpec(name, "kafka", {"topic": "out", "staging_root": "/tmp/staging", **extra})


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}", check=False)
    ledger.upgrade()
    return ledger


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
    ledger: Ledger, tmp_path: Path, sinks: tuple[SinkSpec, ...], group: str | None
) -> None:
    settings = Settings(tmp_path, "127.0.0.1:1", "postgresql://u@127.0.0.1:1/db", "sqlite://", 60.0)
    coordinator = Coordinator.for_pipeline(_spec(*sinks), ledger, settings)
    assert coordinator.position_group() == group
