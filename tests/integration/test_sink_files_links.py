"""files sink: no write, rename or delete goes through a symbolic link planted under its root."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.errors import UnsafePath
from onceflow.sinks.files import FilesCommitter, FilesWriter, read_committed_table

pytestmark = pytest.mark.integration


@pytest.fixture
def config(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "root").mkdir()
    return {"root": str(tmp_path / "root"), "table": "events"}


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    return folder


def task(epoch: int = 1) -> TaskContext:
    return TaskContext("pl", epoch, 0, "s0-t0", "a1", "out")


def stage(config: dict[str, Any], ctx: TaskContext) -> Committable:
    writer = FilesWriter(config)
    writer.begin(ctx)
    writer.write({"id": i} for i in range(3))
    return writer.pre_commit()


def test_a_linked_epoch_folder_is_refused_at_commit_and_nothing_lands_outside(
    config: dict[str, Any], outside: Path
) -> None:
    committable = stage(config, task())
    table = Path(config["root"]) / "events"
    table.mkdir()
    os.symlink(outside, table / "epoch=1")
    with pytest.raises(UnsafePath) as refused:
        FilesCommitter(config).commit([committable])
    message = str(refused.value)
    assert "\n" not in message and "epoch=1 is a symbolic link" in message
    assert list(outside.iterdir()) == []
    assert read_committed_table(config["root"], "events").num_rows == 0
    # The staging is intact: once the link is gone the same commit goes through.
    (table / "epoch=1").unlink()
    FilesCommitter(config).commit([committable])
    assert read_committed_table(config["root"], "events").column("id").to_pylist() == [0, 1, 2]


def test_a_linked_table_or_log_folder_is_refused(config: dict[str, Any], outside: Path) -> None:
    committable = stage(config, task())
    os.symlink(outside, Path(config["root"]) / "events")
    with pytest.raises(UnsafePath, match="is a symbolic link"):
        FilesCommitter(config).commit([committable])
    assert list(outside.iterdir()) == []
    (Path(config["root"]) / "events").unlink()
    (Path(config["root"]) / "events").mkdir()
    os.symlink(outside, Path(config["root"]) / "events" / "_onceflow_log")
    with pytest.raises(UnsafePath, match="_onceflow_log is a symbolic link"):
        FilesCommitter(config).commit([committable])
    assert list(outside.iterdir()) == []


def test_a_linked_staging_folder_is_refused_before_anything_is_written_or_deleted(
    config: dict[str, Any], outside: Path
) -> None:
    (outside / "keep.txt").write_text("mine")
    staging = Path(config["root"]) / "_staging"
    staging.mkdir()
    os.symlink(outside, staging / "pl")
    writer = FilesWriter(config)
    with pytest.raises(UnsafePath, match="_staging/pl is a symbolic link"):
        writer.begin(task())
    assert [p.name for p in outside.iterdir()] == ["keep.txt"]
    # An abort of a committable under the link deletes nothing there either.
    (outside / "out/epoch=1/s0-t0/attempt-a1").mkdir(parents=True)
    fake = Committable.for_task(task(), handle={"table": "events", "files": []}, record_count=0, checksum="")
    with pytest.raises(UnsafePath):
        FilesCommitter(config).abort([fake])
    assert (outside / "out/epoch=1/s0-t0/attempt-a1").is_dir()
