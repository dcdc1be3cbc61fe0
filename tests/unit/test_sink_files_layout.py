"""Pure parts of the files sink on object storage: where an attempt's file and marker go, how a log
entry found in place of a commit's is judged, and how an s3:// root is configured."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.config import Settings
from onceflow.errors import ConfigError
from onceflow.pipeline import SinkSpec
from onceflow.sinks import files
from onceflow.sinks._files_objects import data_name, log_uri, marker_of
from onceflow.sinks._files_table import CommitLogEntry, live_files, removes_for
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.errors import ConflictingAttempt
from onceflow.storage.s3 import S3Settings

TASK = TaskContext("pf", 7, 0, "s0-t1", "3.0.12", "out")
S3 = {"endpoint_url": "http://127.0.0.1:1", "access_key_id": "k", "secret_access_key": "s"}


def test_an_attempt_writes_its_own_final_name_and_marker() -> None:
    assert data_name(TASK) == "epoch=7/pf/out/s0-t1-3.0.12.parquet"
    assert marker_of("s3://b/lake", TASK) == "s3://b/lake/_staging/pf/out/epoch=7/s0-t1/attempt-3.0.12.json"
    assert log_uri("s3://b/lake/events", 7) == "s3://b/lake/events/_onceflow_log/00000000000000000007.json"
    # a committable of the attempt names the same file, so abort finds it from the identity alone
    assert data_name(Committable.for_task(TASK)) == data_name(TASK)


def test_names_that_would_leave_the_table_are_refused() -> None:
    from dataclasses import replace

    for bad in (replace(TASK, task="../x"), replace(TASK, attempt="a/b"), replace(TASK, pipeline="")):
        with pytest.raises(ConfigError):
            data_name(bad)


def test_an_entry_found_in_place_did_this_commit_when_it_has_the_owner_and_every_file() -> None:
    both = ("epoch=3/pf/out/s0-t0-a.parquet", "epoch=3/pf/out/s0-t1-a.parquet")
    found = CommitLogEntry(3, "pf", "out", tuple(reversed(both)), ("old",), 9)
    CommitLogEntry(3, "pf", "out", both).check_done_by(found, "t")  # a retry
    CommitLogEntry(3, "pf", "out", both[:1]).check_done_by(found, "t")  # the sweeper's one winner
    CommitLogEntry(3, "pf", "out", ()).check_done_by(found, "t")  # a winner that wrote no rows
    with pytest.raises(ConflictingAttempt, match="pf/out, not pg/out"):
        CommitLogEntry(3, "pg", "out", both).check_done_by(found, "t")
    with pytest.raises(ConflictingAttempt, match=r"other files .*, not epoch=3/pf/out/s0-t0-b\.parquet"):
        CommitLogEntry(3, "pf", "out", (both[1], "epoch=3/pf/out/s0-t0-b.parquet")).check_done_by(found, "t")
    with pytest.raises(ConflictingAttempt, match=r"\(none\)"):
        CommitLogEntry(3, "pf", "out", both).check_done_by(CommitLogEntry(3, "pf", "out", ()), "t")


def test_removes_follow_the_mode_and_the_replaced_epochs() -> None:
    earlier = [
        CommitLogEntry(1, "p", "s", ("e1",)),
        CommitLogEntry(2, "p", "s", ("e2",)),
        CommitLogEntry(3, "p", "s", ("e3",), ("e2",)),
    ]
    assert live_files(earlier) == ["e1", "e3"]
    assert removes_for(earlier, "replace", ()) == ("e1", "e3")
    assert removes_for(earlier, "append", ()) == ()
    assert removes_for(earlier, "append", (1, 2)) == ("e1",)  # e2 is gone already


def test_an_s3_root_is_kept_as_it_is_and_needs_the_store_settings(tmp_path: Path) -> None:
    config = files.FilesConfig.from_mapping({"root": "s3://b/lake/", "table": "t", "s3": S3})
    assert (config.root, config.table_uri, config.in_bucket) == ("s3://b/lake", "s3://b/lake/t", True)
    assert config.s3 == S3Settings.from_config(S3, "test")
    with pytest.raises(ConfigError, match="config_for"):
        files.FilesConfig.from_mapping({"root": "s3://b/lake", "table": "t"})
    with pytest.raises(ConfigError, match="bucket"):
        files.FilesConfig.from_mapping({"root": "s3:///lake", "table": "t", "s3": S3})
    with pytest.raises(ConfigError, match="s3:// root"):
        files.FilesConfig.from_mapping({"root": str(tmp_path), "table": "t", "s3": S3})
    local = files.FilesConfig.from_mapping({"root": "relative/folder", "table": "t"})
    assert Path(local.root).is_absolute() and local.s3 is None


def test_the_kind_builds_the_writer_and_committer_that_fit_the_root(tmp_path: Path) -> None:
    kind = files.SINK_KIND
    settings = Settings.from_env(
        {"ONCEFLOW_HOME": str(tmp_path), **{f"AWS_{k}": v for k, v in _env().items()}}
    )
    bucket = kind.config_for(SinkSpec("out", "files", {"root": "s3://b/lake", "table": "t"}), settings)
    assert settings.s3 is not None and bucket["s3"] == settings.s3.to_config()
    assert isinstance(kind.build_writer(bucket), files.ObjectFilesWriter)
    assert isinstance(kind.build_committer(bucket), files.ObjectFilesCommitter)
    folder = kind.config_for(SinkSpec("out", "files", {"root": str(tmp_path), "table": "t"}), settings)
    assert "s3" not in folder
    assert isinstance(kind.build_writer(folder), files.FilesWriter)
    assert isinstance(kind.build_committer(folder), files.FilesCommitter)
    with pytest.raises(ConfigError, match="ObjectFilesWriter"):
        files.FilesWriter(bucket)


def _env() -> dict[str, str]:
    return {"ENDPOINT_URL": "http://127.0.0.1:1", "ACCESS_KEY_ID": "k", "SECRET_ACCESS_KEY": "s"}
