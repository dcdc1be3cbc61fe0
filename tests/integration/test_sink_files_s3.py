"""files sink on the stack's S3 server: tasks write in place, a create-only log entry commits an epoch,
and a reader written here from the documented rule (list the log, apply entries in epoch order, read the
named objects) sees exactly what `read_committed_table` sees."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.sinks import files
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.errors import AlreadyCommitted, ConflictingAttempt, StagedOutputLost
from onceflow.storage.s3 import S3Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def s3(settings: Settings) -> S3Settings:
    if settings.s3 is None:
        pytest.fail("AWS_* variables not set: export the stack's env file", pytrace=False)
    return settings.s3


@pytest.fixture
def root(request: pytest.FixtureRequest) -> str:
    return f"s3://onceflow/{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def config(root: str, s3: S3Settings) -> dict[str, Any]:
    return {"root": root, "table": "events", "batch_size": 2, "s3": s3.to_config()}


def task(epoch: int = 1, name: str = "s0-t0", attempt: str = "a1", pipeline: str = "pf") -> TaskContext:
    return TaskContext(pipeline, epoch, 0, name, attempt, "out")


def stage(config: dict[str, Any], ctx: TaskContext, ids: list[int]) -> Committable:
    writer = files.files_writer(config)
    writer.begin(ctx)
    writer.write({"id": i, "name": f"n{i}"} for i in ids)
    return writer.pre_commit()


def ids(config: dict[str, Any], s3: S3Settings) -> list[int]:
    table = files.read_committed_table(config["root"], "events", s3=s3)
    return sorted(table.column("id").to_pylist()) if table.num_rows else []


def keys_under(s3: S3Settings, url: str) -> list[str]:
    """Every object key under ``url``, listed with boto3 (not through the sink's store)."""
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return sorted(o["Key"][len(prefix) + 1 :] for page in pages for o in page.get("Contents", []))


def independent_read(s3: S3Settings, table_url: str) -> list[dict[str, Any]]:
    """The reader rule, written here apart from the sink: list ``_onceflow_log/``, parse each entry's
    JSON, apply adds and removes in epoch order, read the named objects with pyarrow."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    bucket, prefix = table_url.removeprefix("s3://").split("/", 1)
    client = s3.client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/_onceflow_log/")
    names = sorted(o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".json"))
    live: list[str] = []
    for key in names:
        entry = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        live = [n for n in live if n not in entry["removes"]] + list(entry["adds"])
    fs = pafs.S3FileSystem(
        endpoint_override=s3.endpoint_url.split("://", 1)[1] if s3.endpoint_url else None,
        scheme="http",
        region=s3.region,
        access_key=s3.access_key_id,
        secret_key=s3.secret_access_key,
    )
    tables = [pq.read_table(f"{bucket}/{prefix}/{name}", filesystem=fs) for name in live]
    return pa.concat_tables(tables).to_pylist() if tables else []


def test_two_tasks_over_two_epochs_read_alike_by_the_sink_and_an_independent_reader(
    config: dict[str, Any], s3: S3Settings
) -> None:
    committer = files.files_committer(config)
    first = [stage(config, task(1, f"s0-t{i}"), [i * 10, i * 10 + 1, i * 10 + 2]) for i in range(2)]
    unseen = stage(config, task(1, "s0-t0", attempt="a2"), [999])  # staged, never committed
    assert ids(config, s3) == [] and independent_read(s3, f"{config['root']}/events") == []
    committer.commit(first)
    second = [stage(config, task(2, f"s0-t{i}"), [100 + i]) for i in range(2)]
    committer.commit(second)
    expected = [0, 1, 2, 10, 11, 12, 100, 101]
    assert ids(config, s3) == expected
    rows = independent_read(s3, f"{config['root']}/events")
    assert sorted(r["id"] for r in rows) == expected
    assert sorted(json.dumps(r, sort_keys=True) for r in rows) == sorted(
        json.dumps(r, sort_keys=True)
        for r in files.read_committed_table(config["root"], "events", s3=s3).to_pylist()
    )
    table_url = f"{config['root']}/events"
    assert files.committed_files(table_url, s3=s3) == [
        f"{table_url}/epoch=1/pf/out/s0-t0-a1.parquet",
        f"{table_url}/epoch=1/pf/out/s0-t1-a1.parquet",
        f"{table_url}/epoch=2/pf/out/s0-t0-a1.parquet",
        f"{table_url}/epoch=2/pf/out/s0-t1-a1.parquet",
    ]
    assert [e.epoch for e in files.read_commit_log(table_url, s3=s3)] == [1, 2]
    # the unseen attempt's object is in the table's folder, but no entry names it
    assert "epoch=1/pf/out/s0-t0-a2.parquet" in keys_under(s3, table_url)
    assert 999 not in ids(config, s3)
    # markers of committed attempts are gone; the uncommitted attempt's is what the sweeper finds
    assert [(c.epoch, c.task, c.attempt) for c in committer.orphans("pf")] == [(1, "s0-t0", "a2")]
    assert committer.orphans("pf")[0] == unseen
    # the row groups are the local writer's: batch_size rows each
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    path = files.committed_files(table_url, s3=s3)[0].removeprefix("s3://")
    assert pq.ParquetFile(path, filesystem=s3.filesystem()).metadata.num_row_groups == 2
    assert isinstance(s3.filesystem(), pafs.S3FileSystem)


def test_a_retried_commit_adds_nothing_and_only_the_committed_attempt_counts(
    config: dict[str, Any], s3: S3Settings
) -> None:
    committer = files.files_committer(config)
    loser = stage(config, task(1, "s0-t0", attempt="a1"), [1, 2])
    winner = stage(config, task(1, "s0-t0", attempt="a2"), [1, 2])
    other = stage(config, task(1, "s0-t1", attempt="a1"), [3])
    committer.commit([winner, other])
    log = files.read_commit_log(f"{config['root']}/events", s3=s3)
    committer.commit([winner, other])  # a retry after success: the entry is judged the same commit
    files.files_committer(config).commit([winner, other])  # so by a fresh committer too
    committer.commit([other])  # and the sweeper's commit of one winner of the committed epoch
    assert files.read_commit_log(f"{config['root']}/events", s3=s3) == log
    assert log[0].adds == ("epoch=1/pf/out/s0-t0-a2.parquet", "epoch=1/pf/out/s0-t1-a1.parquet")
    assert ids(config, s3) == [1, 2, 3]
    with pytest.raises(ConflictingAttempt, match="other files"):
        committer.commit([loser])  # the epoch is decided: another attempt's files are not it
    assert [(c.task, c.attempt) for c in committer.orphans("pf")] == [("s0-t0", "a1")]
    committer.abort([loser])
    assert "epoch=1/pf/out/s0-t0-a1.parquet" not in keys_under(s3, f"{config['root']}/events")
    assert ids(config, s3) == [1, 2, 3] and committer.orphans("pf") == []


def test_abort_deletes_data_and_marker_and_refuses_after_commit(
    config: dict[str, Any], s3: S3Settings
) -> None:
    committer = files.files_committer(config)
    aborted = stage(config, task(1, "s0-t0"), [1, 2, 3])
    assert "epoch=1/pf/out/s0-t0-a1.parquet" in keys_under(s3, f"{config['root']}/events")
    committer.abort([aborted])
    committer.abort([aborted])  # idempotent
    assert keys_under(s3, f"{config['root']}/events") == []
    assert [k for k in keys_under(s3, config["root"]) if k.endswith(".json")] == []
    with pytest.raises(StagedOutputLost):
        committer.commit([aborted])
    assert files.read_commit_log(f"{config['root']}/events", s3=s3) == []
    committed = stage(config, task(2, "s0-t0"), [4])
    committer.commit([committed])
    with pytest.raises(AlreadyCommitted):
        committer.abort([committed])
    assert ids(config, s3) == [4]


def test_orphans_list_an_attempt_that_died_before_pre_commit_and_abort_cleans_it(
    config: dict[str, Any], s3: S3Settings
) -> None:
    complete = stage(config, task(3, "s0-t0"), [1])
    dead = files.files_writer(config)
    dead.begin(task(3, "s0-t1", attempt="a7"))
    dead.write([{"id": 2, "name": "x"}])  # the task dies here: its marker says it began, no pre-commit
    committer = files.files_committer(config)
    found = {(c.task, c.attempt): c for c in committer.orphans("pf")}
    assert sorted(found) == [("s0-t0", "a1"), ("s0-t1", "a7")]
    assert found["s0-t0", "a1"] == complete
    assert found["s0-t1", "a7"].handle == {"incomplete": True} and found["s0-t1", "a7"].epoch == 3
    with pytest.raises(StagedOutputLost, match="never pre-committed"):
        committer.commit([found["s0-t1", "a7"]])
    committer.abort(list(found.values()))
    assert committer.orphans("pf") == [] and keys_under(s3, config["root"]) == []


def test_replace_mode_keeps_the_last_epoch_and_deletes_superseded_objects_an_epoch_later(
    config: dict[str, Any], s3: S3Settings
) -> None:
    config = {**config, "mode": "replace"}
    table_url = f"{config['root']}/events"
    committer = files.files_committer(config)
    committer.commit([stage(config, task(1, f"s0-t{i}"), [i]) for i in range(2)])
    assert ids(config, s3) == [0, 1]
    second = [stage(config, task(2), [5, 6])]
    committer.commit(second)
    committer.commit(second)
    assert ids(config, s3) == [5, 6]
    assert files.read_commit_log(table_url, s3=s3)[1].removes == (
        "epoch=1/pf/out/s0-t0-a1.parquet",
        "epoch=1/pf/out/s0-t1-a1.parquet",
    )
    assert "epoch=1/pf/out/s0-t0-a1.parquet" in keys_under(s3, table_url)  # a reader that listed epoch 1
    committer.commit([stage(config, task(3), [7])])
    assert ids(config, s3) == [7]
    assert sorted(r["id"] for r in independent_read(s3, table_url)) == [7]
    assert [k for k in keys_under(s3, table_url) if k.startswith("epoch=1/")] == []
    assert "epoch=2/pf/out/s0-t0-a1.parquet" in keys_under(s3, table_url)


def test_a_replacement_epoch_removes_the_objects_of_the_epochs_it_replaces(
    config: dict[str, Any], s3: S3Settings
) -> None:
    committer = files.files_committer(config)
    committer.commit([stage(config, task(1), [1, 2])])
    committer.commit([stage(config, task(2), [3])])
    committer.commit([stage(config, replace(task(3), replaces=(1,)), [1, 2])])
    assert ids(config, s3) == [1, 2, 3]
    entry = files.read_commit_log(f"{config['root']}/events", s3=s3)[-1]
    assert entry.removes == ("epoch=1/pf/out/s0-t0-a1.parquet",) and entry.adds == (
        "epoch=3/pf/out/s0-t0-a1.parquet",
    )


def test_a_second_pipeline_writing_the_same_table_and_epoch_conflicts(
    config: dict[str, Any], s3: S3Settings
) -> None:
    committer = files.files_committer(config)
    committer.commit([stage(config, task(1, pipeline="pf"), [1])])
    other = stage(config, task(1, pipeline="pg"), [2])
    with pytest.raises(ConflictingAttempt, match="pf/out, not pg/out"):
        committer.commit([other])
    assert ids(config, s3) == [1]
    committer.abort([other])  # not in the entry: its object and marker go
    assert keys_under(s3, f"{config['root']}/events") == [
        "_onceflow_log/00000000000000000001.json",
        "epoch=1/pf/out/s0-t0-a1.parquet",
    ]


def test_a_lost_object_is_refused_before_any_entry(config: dict[str, Any], s3: S3Settings) -> None:
    committable = stage(config, task(), [1])
    bucket, prefix = config["root"].removeprefix("s3://").split("/", 1)
    s3.client().delete_object(Bucket=bucket, Key=f"{prefix}/events/epoch=1/pf/out/s0-t0-a1.parquet")
    with pytest.raises(StagedOutputLost, match="gone"):
        files.files_committer(config).commit([committable])
    assert files.read_commit_log(f"{config['root']}/events", s3=s3) == []


def test_credentials_never_appear_in_errors(config: dict[str, Any], s3: S3Settings) -> None:
    wrong = replace(s3, secret_access_key="wrong-" + uuid.uuid4().hex)
    config = {**config, "s3": wrong.to_config()}
    failures: list[str] = []
    for call in (
        lambda: stage(config, task(), [1]),
        lambda: files.files_committer(config).commit([stage({**config, "s3": s3.to_config()}, task(2), [1])]),
        lambda: files.files_committer(config).orphans("pf"),
        lambda: files.read_committed_table(config["root"], "events", s3=wrong),
    ):
        with pytest.raises(OSError) as caught:
            call()
        failures.append(f"{caught.value!r} {caught.value}")
    for text in failures:
        assert wrong.secret_access_key not in text and s3.secret_access_key not in text, text
        assert s3.access_key_id is None or s3.access_key_id not in text, text


def test_a_bucket_file_has_the_local_files_schema_and_row_groups_when_the_schema_grows(
    config: dict[str, Any], s3: S3Settings, tmp_path: Any
) -> None:
    import pyarrow.parquet as pq

    # the first row groups know no item type (empty lists); a later row shows it: the file is rewritten
    rows = [{"id": i, "tags": []} for i in range(4)] + [{"id": 4, "tags": ["x"]}, {"id": 5, "tags": None}]
    local = {"root": str(tmp_path), "table": "events", "batch_size": 2}
    made = {}
    for name, where in (("bucket", config), ("disk", local)):
        writer = files.files_writer(where)
        writer.begin(task())
        writer.write(rows[:4])
        writer.write(rows[4:])
        c = writer.pre_commit()
        files.files_committer(where).commit([c])
        made[name] = c
    uri = files.committed_files(f"{config['root']}/events", s3=s3)[0]
    in_bucket = pq.ParquetFile(uri.removeprefix("s3://"), filesystem=s3.filesystem())
    on_disk = pq.ParquetFile(files.committed_files(tmp_path / "events")[0])
    assert in_bucket.schema_arrow == on_disk.schema_arrow
    assert str(in_bucket.schema_arrow.field("tags").type.value_type) == "string"
    assert in_bucket.metadata.num_row_groups == on_disk.metadata.num_row_groups == 3
    assert in_bucket.read().to_pylist() == on_disk.read().to_pylist() == rows
    assert made["bucket"].checksum == made["disk"].checksum  # the same bytes, hashed as they went out
