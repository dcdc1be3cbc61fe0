"""The fault tests' checkers fire: each is fed a planted violation and must report it, and a clean input
that it must pass. A checker that always returned nothing would pass every fault test, so these are
what make the fault tests able to fail. Here, the checkers that need no service: the tallies, the order
of the Kafka output's records and of a files sink's committed Parquet files (real files, committed by
the files sink itself), and the harness's record of which crashes fired (real SIGKILLed processes).
The checkers that read PostgreSQL, Kafka, the ledger and Iceberg are in
tests/faults/test_checkers_fire.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from onceflow.config import Settings
from onceflow.executor.slices import SliceRef
from onceflow.executor.writing import write_task
from onceflow.faults import CRASH_AT_ENV, CRASH_SKIP_ENV, CRASH_STATE_ENV, crashed
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.files import FilesCommitter, read_commit_log, read_committed_table
from tests.faults import harness, invariants

# ------------------------------------------------------------------------------------------ tallies


def test_a_tally_counts_what_was_lost_duplicated_and_should_never_be_there() -> None:
    clean = invariants.tally("pg", {1, 2, 3}, [3, 1, 2])
    assert (clean.delivered, clean.lost, clean.duplicates, clean.unexpected) == (3, 0, 0, 0)
    assert clean.guarantee == "exactly-once"
    twice = invariants.tally("pg", {1, 2, 3}, [1, 2, 3, 2, 2])
    assert (twice.lost, twice.duplicates, twice.unexpected) == (0, 2, 0)
    assert twice.guarantee == "at-least-once"
    lost = invariants.tally("pg", {1, 2, 3}, [1, 3, 3])
    assert (lost.delivered, lost.lost, lost.duplicates) == (2, 1, 1)
    assert lost.guarantee == "at-most-once"  # anything lost, whatever else happened
    aborted = invariants.tally("pg", {1, 2}, [1, 2, 1_000_000, 1_000_000])
    assert (aborted.lost, aborted.duplicates, aborted.unexpected) == (0, 0, 2)


# ---------------------------------------------------------------------------------- Kafka output order


def _record(out: int, partition: int, offset: int) -> tuple[int, dict[str, Any]]:
    return out, {"id": 100 * partition + offset, "_partition": partition, "_offset": offset}


def test_an_out_of_order_record_in_the_kafka_output_is_reported() -> None:
    # Two output partitions, each holding records of several source partitions interleaved, in order.
    clean = [_record(0, 0, 1), _record(0, 1, 1), _record(0, 0, 4), _record(1, 0, 2), _record(0, 1, 2)]
    assert invariants.order_violations(clean) == []
    planted = [*clean, _record(0, 0, 3)]  # source partition 0's offset 3 after its offset 4
    assert invariants.order_violations(planted) == [
        "kafka output partition 0: source partition 0 offset 3 after 4"
    ]
    repeated = [*clean, _record(1, 0, 2)]  # a record twice in a row is out of order too
    assert invariants.order_violations(repeated) == [
        "kafka output partition 1: source partition 0 offset 2 after 2"
    ]


# ------------------------------------------------------------------------------------ files sink order


def _files(tmp_path: Path) -> tuple[SliceRef, SinkSpec, FilesCommitter]:
    sink = SinkSpec("files", "files", {"root": str(tmp_path / "files"), "table": "records"})
    spec = Pipeline("ordered", KafkaSource(("in",)), JsonFormat({"id": "int"}), (sink,))
    settings = Settings(tmp_path, "127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", f"sqlite:///{tmp_path}/l.db")
    ref = SliceRef(spec, 1, 0, (OffsetRange("in", 0, 0, 9),), "127.0.0.1:1", settings=settings)
    return ref, sink, FilesCommitter(sink.config)


def _rows(*positions: tuple[int, int]) -> list[dict[str, int]]:
    return [{"id": 100 * p + o, "_partition": p, "_offset": o} for p, o in positions]


def test_an_out_of_order_row_in_a_committed_file_is_reported(tmp_path: Path) -> None:
    ref, sink, committer = _files(tmp_path)
    # Task 0 keeps each source partition's order; task 1's file holds partition 1's offset 3 after 5.
    # A source partition's order is per file (one task's output): task 0's rows may come after task 1's.
    good = write_task(ref, sink, "s0-t0", "a", _rows((0, 1), (1, 2), (0, 2), (1, 7)))
    bad = write_task(ref, sink, "s0-t1", "a", _rows((1, 5), (2, 0), (1, 3)))
    # Staged only, never committed: no reader sees it, so its disorder is no violation.
    write_task(ref, sink, "s0-t2", "a", _rows((0, 9), (0, 8)))
    committer.commit([good.to_committable()])
    assert invariants.files_order_violations(tmp_path / "files", "records") == []
    committer.commit([bad.to_committable()])
    [problem] = invariants.files_order_violations(tmp_path / "files", "records")
    assert problem.startswith("files table records, ") and problem.endswith(
        ": source partition 1 offset 3 after 5"
    )
    assert "s0-t1" in problem


# ------------------------------------------------------------------------------- crashes that fired


def _outcome(tmp_path: Path, name: str, point: str, skip: int) -> harness.StepOutcome:
    """A real process armed with ``point``, which reaches it once: SIGKILLed there unless ``skip``
    lets that hit pass."""
    state = tmp_path / name
    env = {**os.environ, CRASH_AT_ENV: point, CRASH_STATE_ENV: str(state), CRASH_SKIP_ENV: str(skip)}
    code = f"from onceflow.faults import crash_point; crash_point({point!r})"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    crash = harness.Crash(point, skip)
    return harness.StepOutcome("epoch", crash, done.returncode, crashed(state, point), {})


def _record_of(number: int, steps: list[harness.StepOutcome], violations: list[str]) -> harness.FaultRecord:
    return harness.FaultRecord(
        number=number,
        fault=steps[0].crash.point if steps[0].crash else "",
        crash=" then ".join(str(s.crash) for s in steps),
        produced=10,
        steps=steps,
        fired=harness.fired(steps),
        verdict=invariants.Verdict(violations=violations),
    )


def test_a_crash_that_never_fired_and_a_violation_are_both_reported(tmp_path: Path) -> None:
    hit = _outcome(tmp_path, "hit", "before_decision", 0)
    assert (hit.returncode, hit.crashed) == (-9, True)
    missed = _outcome(tmp_path, "missed", "after_decision", 1)  # the one hit passes: no crash
    assert (missed.returncode, missed.crashed) == (0, False)
    run = harness.FaultRun(seed=1, executor="local")
    run.records = [_record_of(1, [hit], []), _record_of(2, [hit, missed], [])]
    assert run.not_fired == ["fault 2 (before_decision then after_decision+1)"]
    assert run.violations == []
    run.records = [_record_of(1, [hit], ["sink pg: 1 lost, 0 duplicated, 0 that must not be there"])]
    assert run.not_fired == []
    assert run.violations == [
        "fault 1 (before_decision): sink pg: 1 lost, 0 duplicated, 0 that must not be there"
    ]
    assert not harness.fired([])  # a fault without a crash did not fire either


def test_a_winner_committed_again_alone_keeps_the_epochs_other_files(tmp_path: Path) -> None:
    """The sweeper re-commits a committed epoch's winners one at a time: the entry keeps every file it
    named, and counts each file's rows once."""
    ref, sink, committer = _files(tmp_path)
    first = write_task(ref, sink, "s0-t0", "a", _rows((0, 1), (0, 2)))
    second = write_task(ref, sink, "s0-t1", "a", _rows((1, 1), (1, 2), (1, 3)))
    committer.commit([first.to_committable(), second.to_committable()])
    committer.commit([second.to_committable()])
    committer.commit([first.to_committable()])
    [entry] = read_commit_log(tmp_path / "files" / "records")
    assert len(entry.adds) == 2 and entry.record_count == 5
    assert sorted(read_committed_table(tmp_path / "files", "records")["_offset"].to_pylist()) == [
        1,
        1,
        2,
        2,
        3,
    ]
