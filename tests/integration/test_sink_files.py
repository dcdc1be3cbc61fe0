"""files sink on a real filesystem: readers see committed epochs only; commit is idempotent."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.errors import AlreadyCommitted, RowError, StagedOutputCorrupt, StagedOutputLost
from onceflow.sinks.files import FilesCommitter, FilesWriter, read_commit_log, read_committed_table

pytestmark = pytest.mark.integration


@pytest.fixture
def config(tmp_path: Path) -> dict[str, Any]:
    return {"root": str(tmp_path), "table": "events", "batch_size": 2}


def task(epoch: int = 1, name: str = "s0-t0", attempt: str = "a1", pipeline: str = "pf") -> TaskContext:
    return TaskContext(pipeline, epoch, 0, name, attempt, "out")


def stage(config: dict[str, Any], ctx: TaskContext, ids: list[int]) -> Committable:
    writer = FilesWriter(config)
    writer.begin(ctx)
    writer.write({"id": i, "name": f"n{i}"} for i in ids)
    return writer.pre_commit()


def ids(config: dict[str, Any]) -> list[int]:
    return sorted(read_committed_table(config["root"], "events").column("id").to_pylist())


def test_staged_output_has_a_manifest_and_is_not_read_until_committed(config: dict[str, Any]) -> None:
    committable = stage(config, task(), [1, 2, 3])
    staged = Path(config["root"]) / "_staging/pf/out/epoch=1/s0-t0/attempt-a1"
    assert sorted(p.name for p in staged.iterdir()) == ["manifest.json", "part-00000.parquet"]
    assert Committable.from_json((staged / "manifest.json").read_text()) == committable
    assert read_committed_table(config["root"], "events").num_rows == 0
    FilesCommitter(config).commit([committable])
    assert ids(config) == [1, 2, 3]
    assert (Path(config["root"]) / "events/epoch=1/s0-t0.parquet").exists()
    assert not (Path(config["root"]) / "_staging/pf").exists()


def test_commit_twice_is_once_and_abort_after_commit_is_refused(config: dict[str, Any]) -> None:
    committables = [stage(config, task(name=f"s0-t{i}"), [i * 10, i * 10 + 1]) for i in range(2)]
    committer = FilesCommitter(config)
    committer.commit(committables)
    committer.commit(committables)
    assert ids(config) == [0, 1, 10, 11]
    assert [e.adds for e in read_commit_log(Path(config["root"]) / "events")] == [
        ("epoch=1/s0-t0.parquet", "epoch=1/s0-t1.parquet")
    ]
    with pytest.raises(AlreadyCommitted):
        committer.abort(committables)


def test_a_commit_interrupted_before_its_log_entry_is_invisible_and_completed_by_a_retry(
    config: dict[str, Any],
) -> None:
    first = stage(config, task(epoch=1), [1])
    FilesCommitter(config).commit([first])
    committables = [stage(config, task(epoch=2, name=f"s0-t{i}"), [100 + i]) for i in range(2)]
    staged = Path(config["root"]) / "_staging/pf/out/epoch=2/s0-t0/attempt-a1/part-00000.parquet"
    moved = Path(config["root"]) / "events/epoch=2/s0-t0.parquet"
    moved.parent.mkdir(parents=True)
    os.replace(staged, moved)  # the crash: one file moved, no log entry yet
    assert ids(config) == [1]
    FilesCommitter(config).commit(committables)
    assert ids(config) == [1, 100, 101]


def test_abort_removes_staging_and_undoes_an_unlogged_move(config: dict[str, Any]) -> None:
    committable = stage(config, task(), [1, 2])
    staged = Path(config["root"]) / "_staging/pf/out/epoch=1/s0-t0/attempt-a1/part-00000.parquet"
    moved = Path(config["root"]) / "events/epoch=1/s0-t0.parquet"
    moved.parent.mkdir(parents=True)
    os.replace(staged, moved)
    committer = FilesCommitter(config)
    committer.abort([committable])
    committer.abort([committable])
    assert not moved.exists()
    assert committer.orphans("pf") == []
    with pytest.raises(StagedOutputLost):
        committer.commit([committable])
    assert read_committed_table(config["root"], "events").num_rows == 0


def test_orphans_list_complete_and_crashed_attempts(config: dict[str, Any]) -> None:
    complete = stage(config, task(epoch=3, name="s0-t0"), [1])
    crashed = FilesWriter(config)
    crashed.begin(task(epoch=3, name="s0-t1", attempt="a7"))
    crashed.write([{"id": 2, "name": "x"}])
    committer = FilesCommitter(config)
    orphans = committer.orphans("pf")
    assert orphans[0] == complete
    assert (orphans[1].epoch, orphans[1].task, orphans[1].attempt, orphans[1].handle) == (
        3,
        "s0-t1",
        "a7",
        {"incomplete": True},
    )
    with pytest.raises(StagedOutputLost):
        committer.commit(orphans[1:])
    committer.abort(orphans)
    assert committer.orphans("pf") == []


def test_corrupted_staging_is_refused(config: dict[str, Any]) -> None:
    committable = stage(config, task(), [1, 2])
    staged = Path(config["root"]) / "_staging/pf/out/epoch=1/s0-t0/attempt-a1/part-00000.parquet"
    staged.write_bytes(staged.read_bytes()[:-5] + b"xxxxx")
    with pytest.raises(StagedOutputCorrupt):
        FilesCommitter(config).commit([committable])
    assert read_committed_table(config["root"], "events").num_rows == 0


def test_declared_columns_reject_rows_that_do_not_fit(config: dict[str, Any]) -> None:
    writer = FilesWriter({**config, "columns": {"id": "int64", "name": "string"}})
    writer.begin(task())
    with pytest.raises(RowError, match="extra"):
        writer.write([{"id": 1, "name": "a", "extra": 1}])
    writer.write([{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}])
    with pytest.raises(RowError):
        writer.write([{"id": "not a number", "name": "d"}, {"id": 4, "name": "e"}])
    writer.abort()
    assert not (Path(config["root"]) / "_staging/pf").exists()


def test_replace_mode_keeps_only_the_last_epoch_and_deletes_superseded_files_an_epoch_later(
    config: dict[str, Any],
) -> None:
    config = {**config, "mode": "replace"}
    table = Path(config["root"]) / "events"
    committer = FilesCommitter(config)
    first = [stage(config, task(1, f"s0-t{i}"), [i]) for i in range(2)]
    committer.commit(first)
    assert ids(config) == [0, 1]
    second = [stage(config, task(2), [5, 6])]
    committer.commit(second)
    committer.commit(second)  # a retried commit recomputes the same entry
    assert ids(config) == [5, 6]
    log = read_commit_log(table)
    assert log[1].removes == ("epoch=1/s0-t0.parquet", "epoch=1/s0-t1.parquet")
    assert (table / "epoch=1/s0-t0.parquet").exists()  # a reader that listed epoch 1 may still read it
    committer.commit([stage(config, task(3), [7])])
    assert ids(config) == [7]
    assert list(table.glob("epoch=1/*.parquet")) == []
    assert (table / "epoch=2/s0-t0.parquet").exists()


def test_unknown_mode_is_refused(config: dict[str, Any]) -> None:
    from onceflow.errors import ConfigError

    with pytest.raises(ConfigError, match="mode='upsert'"):
        FilesCommitter({**config, "mode": "upsert"})


def test_a_replacement_epoch_removes_the_files_of_the_epochs_it_replaces(config: dict[str, Any]) -> None:
    from dataclasses import replace

    committer = FilesCommitter(config)
    committer.commit([stage(config, task(1), [1, 2])])
    committer.commit([stage(config, task(2), [3])])
    again = replace(task(3), replaces=(1,))
    committer.commit([stage(config, again, [1, 2])])
    assert ids(config) == [1, 2, 3]  # epoch 1's rows once, from epoch 3's files
    entry = read_commit_log(Path(config["root"]) / "events")[-1]
    assert entry.removes == ("epoch=1/s0-t0.parquet",) and entry.adds == ("epoch=3/s0-t0.parquet",)
