"""Pure parts of the files sink: the commit log decides which files a reader sees."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.errors import ConfigError
from onceflow.sinks.files import CommitLogEntry, FilesConfig, committed_files, log_entry_path


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
