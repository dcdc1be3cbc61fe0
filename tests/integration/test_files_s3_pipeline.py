"""A pipeline into a files table in a bucket, epoch after epoch, on the warm Spark runtime: its tasks
stream Parquet straight to the S3 server and each epoch's commit is one create-only log entry. Each
record is read once, each file keeps its source partitions' order, and no attempt's marker is left."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.engine.runner import run_until
from onceflow.pipeline import Pipeline, SinkSpec
from onceflow.sinks.files import committed_files, read_commit_log, read_committed_table
from onceflow.storage.s3 import S3Settings
from tests.integration.pipeline_helpers import committed_epochs, produce_views, views_pipeline
from tests.integration.s3_helpers import objects

pytestmark = pytest.mark.integration

PIPELINE: Pipeline | None = None  # set by the test; `run_until` loads it as this module's attribute


def test_each_record_lands_once_in_a_bucket_table_committed_by_log_entries(
    settings: Settings, s3: S3Settings, make_topic: Any, bucket_prefix: str, run_settings: Settings
) -> None:
    import pyarrow.parquet as pq

    global PIPELINE
    topic = make_topic("files-s3", partitions=2)
    name = f"files_s3_{uuid.uuid4().hex[:8]}"
    root = f"{bucket_prefix}/{name}"
    PIPELINE = views_pipeline(
        name, topic, SinkSpec("lake", "files", {"root": root, "table": "views", "batch_size": 7})
    )
    path = f"{__name__}:PIPELINE"
    produce_views(settings.kafka_bootstrap, topic, range(100))
    run_until(path, run_settings, until_caught_up=True, executor="connect")
    produce_views(settings.kafka_bootstrap, topic, range(100, 160))
    run_until(path, run_settings, until_caught_up=True, executor="connect")

    table = read_committed_table(root, "views", s3=s3)
    assert sorted(table.column("id").to_pylist()) == list(range(160))
    committed = [e.number for e in committed_epochs(run_settings, name)]
    log = read_commit_log(f"{root}/views", s3=s3)
    assert len([e for e in log if e.adds]) >= 3  # several epochs, each its own entry
    assert {e.epoch for e in log} <= set(committed)
    assert all((e.pipeline, e.sink) == (name, "lake") for e in log)
    for uri in committed_files(f"{root}/views", s3=s3):
        rows = pq.read_table(uri.removeprefix("s3://"), filesystem=s3.filesystem()).to_pylist()
        for partition in (0, 1):
            offsets = [r["_offset"] for r in rows if r["_partition"] == partition]
            assert offsets == sorted(offsets), (uri, partition)
    assert objects(s3, f"{root}/_staging") == []  # no staged object left
