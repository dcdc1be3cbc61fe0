"""After each committed epoch the pipeline's position is the consumer group onceflow-<pipeline>, so
Kafka's own kafka-consumer-groups (and any lag exporter) sees the pipeline's lag."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer

from onceflow.config import Settings
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus, Ledger
from onceflow.sources.consumer_group import group_positions, publish_positions
from tests.integration.engine.data import orders, produce

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
REPLICATE = "tests.integration.engine.pipelines:REPLICATE"


def _describe(group: str) -> dict[int, tuple[int, int]]:
    """kafka-consumer-groups --describe: partition -> (current offset, lag), as Kafka's tool prints it."""
    done = subprocess.run(
        [str(ROOT / "infra" / "kafka.sh"), "consumer-groups", "--describe", "--group", group],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[0] == group and fields[2].isdigit():
            rows[int(fields[2])] = (int(fields[3]), int(fields[5]))
    return rows


def test_kafka_tools_see_the_committed_position_and_the_lag(stack, settings) -> None:
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(0, 30), abort=orders(500, 3))
    outcome = run_epoch(REPLICATE, Settings.from_env(), executor="local")
    assert outcome.epoch.status is EpochStatus.COMMITTED
    pipeline = outcome.epoch.pipeline
    group = f"onceflow-{pipeline}"
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        committed = ledger.committed_offsets(pipeline)
    assert group_positions(settings.kafka_bootstrap, group, committed) == committed
    described = _describe(group)
    assert {p: offset for p, (offset, _) in described.items()} == {p: o for (_, p), o in committed.items()}
    assert all(lag == 0 for _, lag in described.values()), described

    # Five records more, without a transaction (whose commit markers Kafka's tool would count as lag).
    plain = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for order in orders(30, 5):
        plain.produce(stack["ONCEFLOW_TEST_TOPIC"], value=json.dumps(order).encode())
    assert plain.flush(30) == 0
    assert sum(lag for _, lag in _describe(group).values()) == 5

    # A group that drifted from the ledger (written by something else) is reported, never trusted.
    publish_positions(settings.kafka_bootstrap, group, {key: 0 for key in committed})
    env = {**os.environ, "ONCEFLOW_PIPELINES": REPLICATE, "PYTHONPATH": str(ROOT)}
    onceflow = str(Path(sys.executable).with_name("onceflow"))
    status = subprocess.run([onceflow, "status", pipeline], env=env, capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert re.search(rf"consumer group '{group}' differs from the ledger \(.*at 0", status.stdout), (
        status.stdout
    )
    as_json = subprocess.run(
        [onceflow, "status", pipeline, "--json"], env=env, capture_output=True, text=True
    )
    assert json.loads(as_json.stdout)["group_matches_ledger"] is False

    # The next committed epoch writes the group again.
    assert run_epoch(REPLICATE, Settings.from_env(), executor="local").epoch.status is EpochStatus.COMMITTED
    assert all(lag == 0 for _, lag in _describe(group).values())
