"""Two attempts of one Spark task (a retry or a speculative copy): one is accepted, the other cleans up."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from onceflow.engine.task_io import LOST_TO_ANOTHER_ATTEMPT, EpochRef, write_task
from onceflow.ledger import Ledger
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.files import FilesCommitter, read_committed_table

RANGE = OffsetRange("in", 0, 0, 4)


def setup(tmp_path: Path) -> tuple[EpochRef, SinkSpec, Ledger]:
    sink = SinkSpec("out", "files", {"root": str(tmp_path / "files"), "table": "t"})
    spec = Pipeline("p", KafkaSource(("in",)), JsonFormat({"n": "int"}), (sink,))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger.connect(url, check=False)
    ledger.upgrade()
    epoch = ledger.plan_epoch("p", [RANGE], [("out", "s0-t0")])
    ref = EpochRef(spec, epoch.number, epoch.attempt_token, 0, (RANGE,), "127.0.0.1:1", url)
    return ref, sink, ledger


def staged(tmp_path: Path) -> list[str]:
    return sorted(p.parent.name for p in (tmp_path / "files/_staging").glob("**/part-*.parquet"))


def test_the_attempt_that_loses_the_race_rolls_back_its_own_staging(tmp_path: Path) -> None:
    ref, sink, ledger = setup(tmp_path)
    results: dict[str, Any] = {}

    def speculative_rows() -> Iterator[dict[str, int]]:
        yield {"n": 1}
        # While this attempt is still writing, the other one stages and pre-commits in full.
        results["a"] = write_task(ref, sink, "s0-t0", "a", iter([{"n": 1}, {"n": 2}]))
        yield {"n": 2}

    results["b"] = write_task(ref, sink, "s0-t0", "b", speculative_rows())
    assert results["a"].accepted and not results["b"].accepted
    assert results["b"].reason == LOST_TO_ANOTHER_ATTEMPT
    assert staged(tmp_path) == ["attempt-a"]  # b removed its staging itself
    assert [p.attempt for p in ledger.participants("p", 1)] == ["a"]

    # A retry arriving after the winner registered writes nothing at all.
    late = write_task(ref, sink, "s0-t0", "c", iter([{"n": 9}]))
    assert (late.accepted, late.records, late.reason) == (False, 0, LOST_TO_ANOTHER_ATTEMPT)
    assert staged(tmp_path) == ["attempt-a"]

    ledger.commit_epoch("p", 1, {"out": FilesCommitter(sink.config)})
    assert sorted(read_committed_table(tmp_path / "files", "t").column("n").to_pylist()) == [1, 2]
    ledger.close()
