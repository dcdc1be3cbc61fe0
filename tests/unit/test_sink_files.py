"""Pure parts of the files sink: the commit log decides which files a reader sees."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.errors import ConfigError
from onceflow.sinks.base import Committable
from onceflow.sinks.errors import UnsafePath
from onceflow.sinks.files import CommitLogEntry, FilesCommitter, FilesConfig, committed_files, log_entry_path
from onceflow.sinks.staging import sha256_file


def write_entry(table_dir: Path, entry: CommitLogEntry) -> None:
    path = log_entry_path(table_dir, entry.epoch)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(entry.to_json())


def test_log_entries_are_named_by_zero_padded_epoch(tmp_path: Path) -> None:
    assert log_entry_path(tmp_path, 42).name == "00000000000000000042.json"


def test_committed_files_apply_adds_and_removes_in_epoch_order(tmp_path: Path) -> None:
    write_entry(tmp_path, CommitLogEntry(2, "p", "s", ("epoch=2/t0.parquet",)))
    write_entry(tmp_path, CommitLogEntry(10, "p", "s", ("epoch=10/t0.parquet",), ("epoch=2/t0.parquet",)))
    write_entry(tmp_path, CommitLogEntry(1, "p", "s", ("epoch=1/t0.parquet", "epoch=1/t1.parquet")))
    (tmp_path / "_onceflow_log" / ".00000000000000000011.json.tmp-1").write_text("{half")
    assert [p.relative_to(tmp_path).as_posix() for p in committed_files(tmp_path)] == [
        "epoch=1/t0.parquet",
        "epoch=1/t1.parquet",
        "epoch=10/t0.parquet",
    ]


def test_entry_json_round_trips() -> None:
    entry = CommitLogEntry(3, "p", "s", ("a",), ("b",), 7)
    assert CommitLogEntry.from_json(entry.to_json()) == entry


def test_config_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'root' is required"):
        FilesConfig.from_mapping({"table": "t"})
    with pytest.raises(ConfigError, match="unknown Arrow type"):
        FilesConfig.from_mapping({"root": str(tmp_path), "table": "t", "columns": {"a": "int77"}})
    with pytest.raises(ConfigError, match="table"):
        FilesConfig.from_mapping({"root": str(tmp_path), "table": "../t"})


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the table that a tampered committable or commit log points at."""
    outside = tmp_path / "outside" / "victim.parquet"
    outside.parent.mkdir()
    outside.write_bytes(b"not the table's")
    return outside


def _committer(tmp_path: Path) -> FilesCommitter:
    return FilesCommitter({"root": str(tmp_path / "root"), "table": "orders"})


@pytest.mark.parametrize(
    "name", ["../../outside/victim.parquet", "/etc/passwd", "epoch=1/../../x", "a//b", "."]
)
def test_a_commit_log_naming_a_file_outside_the_table_is_refused_in_one_line(
    tmp_path: Path, name: str
) -> None:
    table_dir = tmp_path / "root" / "orders"
    write_entry(table_dir, CommitLogEntry(1, "p", "s", ("epoch=1/t0.parquet", name)))
    with pytest.raises(UnsafePath) as refused:
        committed_files(table_dir)
    assert str(refused.value) == (
        f"files: commit log entry of epoch 1 adds {name!r}: expected a relative path inside its folder "
        "(no '..', not absolute)"
    )


def test_compaction_never_deletes_a_file_outside_the_table(tmp_path: Path, victim: Path) -> None:
    table_dir = tmp_path / "root" / "orders"
    escape = "../../outside/victim.parquet"
    assert (table_dir / escape).resolve() == victim.resolve()
    write_entry(table_dir, CommitLogEntry(1, "p", "s", (), (escape,)))
    committable = Committable("p", 2, 0, "s0-t0", "a1", "s", handle={"table": "orders", "files": []})
    with pytest.raises(UnsafePath):
        _committer(tmp_path).commit([committable])
    assert victim.exists()


def test_a_committable_naming_a_staged_file_outside_its_folder_moves_nothing(
    tmp_path: Path, victim: Path
) -> None:
    committer = _committer(tmp_path)
    committable = Committable(
        "p", 1, 0, "s0-t0", "a1", "s", handle={"files": [{"name": "../" * 7 + "outside/victim.parquet"}]}
    )
    staged = committer._area.for_committable(committable)
    staged.mkdir(parents=True)
    assert (staged / committable.handle["files"][0]["name"]).resolve() == victim.resolve()
    spec = {**committable.handle["files"][0], "sha256": sha256_file(victim)}
    committable = Committable("p", 1, 0, "s0-t0", "a1", "s", handle={"files": [spec]})
    with pytest.raises(UnsafePath, match=r"^files: s epoch 1 s0-t0 staged file '\.\./"):
        committer.commit([committable])
    assert victim.exists() and not (tmp_path / "root" / "orders").exists()


def test_abort_of_a_task_named_outside_the_table_deletes_nothing(tmp_path: Path, victim: Path) -> None:
    task = "../../../outside/victim"
    assert (tmp_path / "root" / "orders" / "epoch=1" / f"{task}.parquet").resolve() == victim.resolve()
    committable = Committable("p", 1, 0, task, "a1", "s", handle={"files": [{"sha256": sha256_file(victim)}]})
    with pytest.raises(UnsafePath, match="expected a single file or folder name"):
        _committer(tmp_path).abort([committable])
    assert victim.exists()
