"""Two attempts of one Spark task (a retry or a speculative copy): the driver accepts one and rolls the
other back, whether it reported (it lost) or never reported (Spark discarded its result)."""

from __future__ import annotations

from pathlib import Path

from onceflow.config import Settings
from onceflow.engine.slice_job import precommit_slice
from onceflow.executor.slices import SliceRef
from onceflow.executor.writing import write_task
from onceflow.ledger import Ledger
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.protocol.coordinator import Coordinator
from onceflow.sinks.files import read_committed_table

RANGE = OffsetRange("in", 0, 0, 4)


def setup(tmp_path: Path) -> tuple[SliceRef, SinkSpec, Ledger, Coordinator]:
    sink = SinkSpec("out", "files", {"root": str(tmp_path / "files"), "table": "t"})
    spec = Pipeline("p", KafkaSource(("in",)), JsonFormat({"n": "int"}), (sink,))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger.connect(url, check=False)
    ledger.upgrade()
    epoch = ledger.plan_epoch("p", [RANGE], [("out", "s0-t0")])
    settings = Settings(tmp_path, "127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", url)
    ref = SliceRef(spec, epoch.number, 0, (RANGE,), "127.0.0.1:1", settings=settings)
    return ref, sink, ledger, Coordinator.for_pipeline(spec, ledger, settings)


def staged(tmp_path: Path) -> list[str]:
    return sorted(p.parent.name for p in (tmp_path / "files/_staging").glob("**/part-*.parquet"))


def test_the_attempt_that_loses_the_race_rolls_back_its_own_staging(tmp_path: Path) -> None:
    ref, sink, ledger, coordinator = setup(tmp_path)
    epoch = ledger.epoch("p", 1)
    a = write_task(ref, sink, "s0-t0", "a", iter([{"n": 1}, {"n": 2}]))
    write_task(ref, sink, "s0-t0", "b", iter([{"n": 1}, {"n": 2}]))  # a speculative copy
    assert staged(tmp_path) == ["attempt-a", "attempt-b"]

    # The first driver reports attempt a; Spark discarded b's result, so b never reports.
    summary = precommit_slice(coordinator, 0, epoch, epoch.attempt_token, [a], [], ["s0-t0"])
    assert [r["accepted"] for r in summary["results"]] == [True]
    assert staged(tmp_path) == ["attempt-a"]  # the unreported attempt was rolled back by the driver
    assert [p.attempt for p in ledger.participants("p", 1)] == ["a"]

    # A re-submitted slice reports another attempt of the same task: it lost, and is rolled back.
    c = write_task(ref, sink, "s0-t0", "c", iter([{"n": 9}]))
    again = precommit_slice(coordinator, 0, epoch, epoch.attempt_token, [c], [], ["s0-t0"])
    assert [r["accepted"] for r in again["results"]] == [False]
    assert staged(tmp_path) == ["attempt-a"]

    coordinator.commit(number=1)
    assert sorted(read_committed_table(tmp_path / "files", "t").column("n").to_pylist()) == [1, 2]
    ledger.close()


def test_a_fenced_slice_rolls_back_everything_it_staged(tmp_path: Path) -> None:
    ref, sink, ledger, coordinator = setup(tmp_path)
    epoch = ledger.epoch("p", 1)
    a = write_task(ref, sink, "s0-t0", "a", iter([{"n": 1}]))
    coordinator.abort(number=1, reason="operator")
    from onceflow.errors import SliceFailed

    try:
        precommit_slice(coordinator, 0, epoch, epoch.attempt_token, [a], [], ["s0-t0"])
    except SliceFailed as failed:
        assert "ABORTED" in str(failed)
    else:
        raise AssertionError("a pre-commit of an aborted epoch was accepted")
    assert staged(tmp_path) == []
    assert ledger.participants("p", 1) == []
    ledger.close()
