"""kafka sink staged in a bucket (``staging_root: s3://…``), on the real broker and the stack's real S3
server: what the tasks stage as objects is published exactly once, in order, by a committer that reads
it back from the bucket; abort and the sweeper find and delete those objects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.engine.runner import run_until
from onceflow.pipeline import Pipeline, SinkSpec
from onceflow.sinks.base import Committable
from onceflow.sinks.errors import SinkError
from onceflow.sinks.kafka import RECORDS, KafkaCommitter
from onceflow.sinks.staging import MANIFEST, STAGING
from onceflow.storage.s3 import S3Settings, split
from tests.integration.kafka_sink_helpers import (
    group_offsets,
    published,
    read_topic,
    sink_setup,
    stage_and_fail_to_publish,
    stage_epoch,
    staged_values,
)
from tests.integration.pipeline_helpers import committed_epochs, produce_views, views_pipeline
from tests.integration.s3_helpers import all_keys

pytestmark = pytest.mark.integration

PIPELINE: Pipeline | None = None  # set by the pipeline test; `run_until` loads it as this module's attribute


@pytest.fixture
def setup(
    settings: Settings, s3: S3Settings, make_topic: Callable[..., str], bucket_prefix: str
) -> dict[str, Any]:
    return {
        **sink_setup(settings, make_topic, staging_root=bucket_prefix, s3=s3.to_config()),
        "s3": s3,
    }


def keys_under(s3: S3Settings, url: str) -> list[str]:
    """Every object key under ``url`` relative to it, as the S3 server lists them (folder markers
    included)."""
    prefix = split(url)[1]
    return [k.removeprefix(prefix + "/") for k in all_keys(s3, url)]


def staged_objects(setup: dict[str, Any]) -> list[str]:
    return keys_under(setup["s3"], f"{setup['config']['staging_root']}/{STAGING}/{setup['pipeline']}")


def in_order(published_values: list[bytes], staged: list[bytes]) -> bool:
    """Whether ``published_values`` keep the order they have in ``staged`` (a subsequence of it)."""
    rest = iter(staged)
    return all(any(value == s for s in rest) for value in published_values)


def test_records_staged_in_a_bucket_are_published_once_in_order(setup: dict[str, Any]) -> None:
    committables = [Committable.from_json(c.to_json()) for c in stage_epoch(setup)]
    assert staged_objects(setup) == [
        f"out/epoch=1/{task}/attempt-a1/{name}"
        for task in ("s0-t0", "s0-t1", "s1-t0")
        for name in (MANIFEST, RECORDS)
    ]
    committer = KafkaCommitter(setup["config"])
    committer.commit(committables)
    committer.commit(committables)  # the retried commit finds the slices published
    records = published(setup)
    assert sorted(value for _, _, value in records) == sorted(staged_values())
    for partition in range(3):
        values = [value for p, _, value in records if p == partition]
        assert in_order(values, staged_values()), f"partition {partition} out of order: {values}"
    keyed = {key: {p for p, k, _ in records if k == key} for _, key, _ in records if key is not None}
    assert all(len(partitions) == 1 for partitions in keyed.values())  # one key, one partition
    assert group_offsets(setup) == {(setup["input"], 0): 9, (setup["input"], 1): 4}
    assert staged_objects(setup) == []
    assert committer.orphans(setup["pipeline"]) == []


def test_a_failed_publish_is_never_visible_and_retries_publish_nothing_twice(setup: dict[str, Any]) -> None:
    committables = stage_and_fail_to_publish(setup)
    assert len(staged_objects(setup)) == 6  # nothing is deleted before its slice is published
    KafkaCommitter(setup["config"]).commit(committables)
    KafkaCommitter(setup["config"]).commit(committables)
    assert sorted(value for _, _, value in published(setup)) == sorted(staged_values())
    assert group_offsets(setup) == {(setup["input"], 0): 9, (setup["input"], 1): 4}


def test_abort_deletes_the_staged_objects_and_publishes_nothing(setup: dict[str, Any]) -> None:
    committables = stage_epoch(setup)
    committer = KafkaCommitter(setup["config"])
    assert [c.to_json() for c in committer.orphans(setup["pipeline"])] == [c.to_json() for c in committables]
    committer.abort(committables)
    committer.abort(committables)
    assert staged_objects(setup) == []  # no object, and no folder marker either
    assert committer.orphans(setup["pipeline"]) == []
    assert published(setup, "read_uncommitted") == []


_KILLED_BEFORE_MANIFEST = """
import json, os, signal, sys
from onceflow.offsets import OffsetRange
from onceflow.sinks.base import TaskContext
from onceflow.sinks.kafka import KafkaWriter

config, pipeline, topic = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
writer = KafkaWriter(config)
writer._area.write_manifest = lambda folder, committable: os.kill(os.getpid(), signal.SIGKILL)
writer.begin(TaskContext(pipeline, 1, 0, "s0-t0", "a1", "out", (OffsetRange(topic, 0, 0, 3),)))
writer.write({"key": None, "value": f"v{i}"} for i in range(3))
writer.pre_commit()
"""


def test_the_sweeper_finds_an_attempt_killed_before_its_manifest_and_abort_deletes_it(
    setup: dict[str, Any],
) -> None:
    task = subprocess.run(
        [
            sys.executable,
            "-c",
            _KILLED_BEFORE_MANIFEST,
            json.dumps(setup["config"]),
            setup["pipeline"],
            setup["input"],
        ],
        env=os.environ.copy(),
        capture_output=True,
        timeout=120,
    )
    assert task.returncode == -9, task.stderr.decode()
    assert staged_objects(setup) == [f"out/epoch=1/s0-t0/attempt-a1/{RECORDS}"]  # whole, no manifest
    committer = KafkaCommitter(setup["config"])
    (orphan,) = committer.orphans(setup["pipeline"])
    assert (orphan.sink, orphan.epoch, orphan.slice, orphan.task, orphan.attempt, orphan.handle) == (
        "out",
        1,
        -1,
        "s0-t0",
        "a1",
        {"incomplete": True},
    )
    with pytest.raises(SinkError):  # an incomplete attempt is never published
        committer.commit([orphan])
    committer.abort([orphan])
    assert staged_objects(setup) == []
    assert committer.orphans(setup["pipeline"]) == []
    assert published(setup, "read_uncommitted") == []


def test_a_pipeline_on_the_spark_runtime_publishes_each_record_once_through_a_bucket(
    settings: Settings,
    s3: S3Settings,
    make_topic: Callable[..., str],
    bucket_prefix: str,
    run_settings: Settings,
) -> None:
    global PIPELINE
    topic, out = make_topic("kafka-s3-in", partitions=2), make_topic("kafka-s3-out", partitions=2)
    name = f"kafka_s3_{uuid.uuid4().hex[:8]}"
    sink = {"topic": out, "staging_root": bucket_prefix, "value_format": "json", "key_column": "id"}
    PIPELINE = views_pipeline(name, topic, SinkSpec("events", "kafka", sink))
    produce_views(settings.kafka_bootstrap, topic, range(120))
    run_until(f"{__name__}:PIPELINE", run_settings, until_caught_up=True, executor="connect")

    records = read_topic(settings.kafka_bootstrap, out, 2, "read_committed")
    rows = [(partition, json.loads(value)) for partition, _, value in records]
    assert sorted(row["id"] for _, row in rows) == list(range(120))  # each record once
    for partition in range(2):  # each input partition's records in their order, in every output partition
        for source in range(2):
            ids = [row["id"] for p, row in rows if p == partition and row["id"] % 2 == source]
            assert ids == sorted(ids), (partition, source, ids)
    epochs = committed_epochs(run_settings, name)
    assert sum(r.span for e in epochs for r in e.ranges) == 120
    assert len([e for e in epochs if any(not r.is_empty for r in e.ranges)]) >= 2  # several epochs
    assert keys_under(s3, f"{bucket_prefix}/{STAGING}/{name}") == []  # every staged object published
