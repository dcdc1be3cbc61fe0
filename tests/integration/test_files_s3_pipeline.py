"""A pipeline into a files table in a bucket, epoch after epoch, on the warm Spark runtime: its tasks
stream Parquet straight to the S3 server and each epoch's commit is one create-only log entry. Each
record is read once, each file keeps its source partitions' order, and no attempt's marker is left."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.engine.runner import run_until
from onceflow.ledger import Ledger
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.files import committed_files, read_commit_log, read_committed_table
from tests.integration.test_delta_pipeline import _produce

pytestmark = pytest.mark.integration

PIPELINE: Pipeline | None = None  # set by the test; `run_until` loads it as this module's attribute


def test_each_record_lands_once_in_a_bucket_table_committed_by_log_entries(
    settings: Settings, make_topic: Any, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    global PIPELINE
    if settings.s3 is None:
        pytest.fail("AWS_* variables not set: export the stack's env file", pytrace=False)
    topic = make_topic("files-s3", partitions=2)
    name = f"files_s3_{uuid.uuid4().hex[:8]}"
    root = f"s3://{os.environ.get('ONCEFLOW_S3_BUCKET', 'onceflow')}/{name}"
    PIPELINE = Pipeline(
        name=name,
        source=KafkaSource(topics=(topic,)),
        format=JsonFormat(schema={"id": "int", "page": "string"}),
        sinks=(SinkSpec("lake", "files", {"root": root, "table": "views", "batch_size": 7}),),
        max_records_per_partition=40,
        max_records_per_task=20,
    )
    run_settings = Settings.from_env(
        {
            **os.environ,
            "ONCEFLOW_LEDGER_URL": f"sqlite:///{tmp_path}/ledger.db",
            "ONCEFLOW_HOME": str(tmp_path),
        }
    )
    with Ledger.connect(run_settings.ledger_url, check=False) as ledger:
        ledger.upgrade()
    path = f"{__name__}:PIPELINE"
    _produce(settings.kafka_bootstrap, topic, range(100))
    run_until(path, run_settings, until_caught_up=True, executor="connect")
    _produce(settings.kafka_bootstrap, topic, range(100, 160))
    run_until(path, run_settings, until_caught_up=True, executor="connect")

    s3 = settings.s3
    table = read_committed_table(root, "views", s3=s3)
    assert sorted(table.column("id").to_pylist()) == list(range(160))
    with Ledger.connect(run_settings.ledger_url) as ledger:
        committed = [e.number for e in ledger.epochs(name) if e.status.value == "COMMITTED"]
    log = read_commit_log(f"{root}/views", s3=s3)
    assert len([e for e in log if e.adds]) >= 3  # several epochs, each its own entry
    assert {e.epoch for e in log} <= set(committed)
    assert all((e.pipeline, e.sink) == (name, "lake") for e in log)
    for uri in committed_files(f"{root}/views", s3=s3):
        rows = pq.read_table(uri.removeprefix("s3://"), filesystem=s3.filesystem()).to_pylist()
        for partition in (0, 1):
            offsets = [r["_offset"] for r in rows if r["_partition"] == partition]
            assert offsets == sorted(offsets), (uri, partition)
    bucket, prefix = root.removeprefix("s3://").split("/", 1)
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/_staging/")
    assert [o["Key"] for o in listed.get("Contents", []) if not o["Key"].endswith("/")] == []
