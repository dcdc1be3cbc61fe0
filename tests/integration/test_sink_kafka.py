"""kafka sink on the real broker: each slice is published exactly once, with its input offsets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.sinks.base import Committable
from onceflow.sinks.kafka import KafkaCommitter
from tests.integration.kafka_sink_helpers import (
    group_offsets,
    published,
    sink_setup,
    stage_and_fail_to_publish,
    stage_epoch,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def setup(settings: Settings, make_topic: Callable[..., str], tmp_path: Path) -> dict[str, Any]:
    return sink_setup(settings, make_topic, staging_root=str(tmp_path))


def test_commit_twice_publishes_once_in_order_and_commits_the_group_offsets(setup: dict[str, Any]) -> None:
    committables = [Committable.from_json(c.to_json()) for c in stage_epoch(setup)]
    assert group_offsets(setup) == {(setup["input"], 0): -1, (setup["input"], 1): -1}
    committer = KafkaCommitter(setup["config"])
    committer.commit(committables)
    committer.commit(committables)
    records = published(setup)
    assert len(records) == 9 + 4 + 3
    assert group_offsets(setup) == {(setup["input"], 0): 9, (setup["input"], 1): 4}
    by_key: dict[bytes, list[str]] = {}
    partitions: dict[bytes, set[int]] = {}
    for partition, key, value in records:
        if key is not None:
            by_key.setdefault(key, []).append(value.decode())
            partitions.setdefault(key, set()).add(partition)
    assert all(len(p) == 1 for p in partitions.values())  # one key, one partition
    assert by_key[b"k0"] == [f"s0-t{0 if i < 5 else 1}:{i}" for i in range(0, 9, 2)] + [
        f"s1-t0:{i}" for i in range(0, 4, 2)
    ]
    assert committer.orphans(setup["pipeline"]) == []


def test_a_failed_publish_is_never_visible_and_a_retry_publishes_once(setup: dict[str, Any]) -> None:
    committables = stage_and_fail_to_publish(setup)
    assert group_offsets(setup)[(setup["input"], 0)] == -1
    KafkaCommitter(setup["config"]).commit(committables)
    assert len(published(setup)) == 16


def test_abort_deletes_the_staging_and_publishes_nothing(setup: dict[str, Any]) -> None:
    committables = stage_epoch(setup)
    committer = KafkaCommitter(setup["config"])
    assert len(committer.orphans(setup["pipeline"])) == 3
    committer.abort(committables)
    committer.abort(committables)
    assert committer.orphans(setup["pipeline"]) == []
    assert not (Path(setup["config"]["staging_root"]) / "_staging" / setup["pipeline"]).exists()
    assert published(setup, "read_uncommitted") == []


_KILLED_COORDINATOR = """
import json, sys
from onceflow.sinks.base import Committable
from onceflow.sinks.kafka import KafkaCommitter
config = json.loads(sys.argv[1])
committables = [Committable.from_json(line) for line in json.loads(sys.argv[2])]

def stop(step):
    if step == "kafka.produced":
        print("produced", flush=True)
        sys.stdin.read()

KafkaCommitter(config, crash_hook=stop).commit(committables)
"""


def test_a_coordinator_killed_mid_publish_is_fenced_and_the_next_one_publishes_once(
    setup: dict[str, Any],
) -> None:
    committables = stage_epoch(setup)
    slice0 = [c for c in committables if c.slice == 0]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _KILLED_COORDINATOR,
            json.dumps(setup["config"]),
            json.dumps([c.to_json() for c in slice0]),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "produced"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert len(published(setup, "read_uncommitted")) == 9 + 2  # the zombie's records are in the log
    KafkaCommitter(setup["config"]).commit(committables)
    assert len(published(setup)) == 16
    assert group_offsets(setup) == {(setup["input"], 0): 9, (setup["input"], 1): 4}
