"""Keyed state as a participant (invariant 7): a snapshot becomes the state a job resumes from only with
its epoch's commit, and an aborted epoch's snapshot never does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from onceflow.committables import TaskContext
from onceflow.config import Settings
from onceflow.ledger import Epoch, Ledger
from onceflow.offsets import OffsetRange
from onceflow.pipeline import STATE_SINK, JsonFormat, KafkaSource, Pipeline, SinkSpec, StateSpec
from onceflow.sinks.files import FilesCommitter, FilesWriter
from onceflow.state.store import committed_state_files, state_sink
from onceflow.testing import coordinator_for_tests

P = "counts"


def stage_state(ledger: Ledger, sink: SinkSpec, epoch: Epoch, rows: list[dict[str, Any]]) -> None:
    """What the slice job does for the state participant: stage the new snapshot, then pre-commit it."""
    writer = FilesWriter(sink.config)
    writer.begin(TaskContext(P, epoch.number, 0, "s0-t0", "a0", STATE_SINK))
    writer.write(rows)
    done = ledger.precommit_slice(P, epoch.number, epoch.attempt_token, [writer.pre_commit()])
    assert len(done.accepted) == 1


def state_rows(files: list[Path]) -> list[dict[str, Any]]:
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def test_state_advances_only_with_committed(tmp_path: Path) -> None:
    settings = Settings.from_env({"ONCEFLOW_HOME": str(tmp_path / "home")})
    spec = Pipeline(
        name=P,
        source=KafkaSource(topics=("in",)),
        format=JsonFormat(schema={"k": "string"}),
        sinks=(SinkSpec("out", "files", {"root": str(tmp_path / "out"), "table": "t"}),),
        state=StateSpec(keys=("k",), reducer="count"),
    )
    sink = state_sink(spec, settings)
    assert sink is not None
    with Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}", check=False) as ledger:
        ledger.upgrade()
        coordinator = coordinator_for_tests(ledger, P, {STATE_SINK: FilesCommitter(sink.config)})

        e1 = ledger.plan_epoch(P, [OffsetRange("in", 0, 0, 2)], [(STATE_SINK, "s0-t0")])
        stage_state(ledger, sink, e1, [{"k": "a", "count": 2}])
        ledger.record_commit_decision(P, e1.number)
        assert committed_state_files(spec, settings) == []  # decided is not committed
        coordinator.commit(number=e1.number)
        first = committed_state_files(spec, settings)
        assert state_rows(first) == [{"k": "a", "count": 2}]

        e2 = ledger.plan_epoch(P, [OffsetRange("in", 0, 2, 5)], [(STATE_SINK, "s0-t0")])
        stage_state(ledger, sink, e2, [{"k": "a", "count": 5}])
        coordinator.abort(number=e2.number, reason="failed")
        assert committed_state_files(spec, settings) == first  # the replay folds into epoch 1's state
        assert ledger.committed_offsets(P) == {("in", 0): 2}
