"""`onceflow run --follow`: one long-lived runner, epochs as records arrive, a clean stop on SIGTERM.

The follower runs as users run it (the `onceflow` command, a real Kafka and PostgreSQL); it is stopped
by a signal while an epoch is paused just before its decision, and must commit that epoch before it
exits, leaving nothing in flight.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onceflow.faults import PAUSE_AT_ENV, PAUSE_DIR_ENV
from onceflow.ledger import EpochStatus, Ledger
from tests.integration.engine.data import orders, pg_ids, produce, wait_while_running

pytestmark = pytest.mark.integration

REPLICATE = "tests.integration.engine.pipelines:REPLICATE"
ROOT = Path(__file__).resolve().parents[3]  # the pipeline module lives in the tests package


def _start_follower(stack: dict[str, str], pause: Path, *options: str) -> subprocess.Popen[str]:
    """`onceflow run --follow` of the replica pipeline, armed to pause before its first decision."""
    env = {
        **os.environ,
        "ONCEFLOW_PIPELINES": REPLICATE,
        "PYTHONPATH": str(ROOT),
        PAUSE_AT_ENV: "before_decision",
        PAUSE_DIR_ENV: str(pause),
    }
    name = f"{stack['ONCEFLOW_TEST_PIPELINE']}-replica"
    command = [
        str(Path(sys.executable).with_name("onceflow")),
        "run",
        name,
        "--follow",
        "--executor",
        "local",
    ]
    return subprocess.Popen(
        [*command, *options], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_follower_commits_new_records_as_they_come_and_stops_cleanly_on_sigterm(
    stack, settings, pg_connect, tmp_path
) -> None:
    topic, table = stack["ONCEFLOW_TEST_TOPIC"], stack["ONCEFLOW_TEST_TABLE"]
    name = f"{stack['ONCEFLOW_TEST_PIPELINE']}-replica"
    pause = tmp_path / "pause"
    follower = _start_follower(stack, pause, "--poll", "0.1")
    try:
        first, second = orders(0, 30), orders(30, 60)
        expected = sorted(o["id"] for o in first)
        produce(settings.kafka_bootstrap, topic, first)
        # Its first epoch stops before the decision: the records are staged, nothing is committed yet.
        wait_while_running(
            lambda: (pause / "paused-before_decision").exists(), "the first epoch's pause", follower
        )
        assert pg_ids(pg_connect, table) == []
        (pause / "resume-before_decision").touch()
        wait_while_running(
            lambda: pg_ids(pg_connect, table) == expected, "the first records' commit", follower
        )
        # Later records need no new process: the same follower plans as soon as they arrive.
        produce(settings.kafka_bootstrap, topic, second)
        expected += sorted(o["id"] for o in second)
        wait_while_running(
            lambda: pg_ids(pg_connect, table) == expected, "the second records' commit", follower
        )
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert "SIGTERM: stopping after the epoch in flight" in out
    assert out.splitlines()[-1].startswith("stopped after ") and "nothing is in flight" in out
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        epochs = ledger.epochs(name)
        assert ledger.open_epoch(name) is None
    assert epochs and all(e.status is EpochStatus.COMMITTED for e in epochs)
    # It waited for records instead of planning empty epochs while idle.
    assert all(sum(r.span for r in e.ranges) > 0 for e in epochs)


def test_sigterm_mid_epoch_lets_that_epoch_commit_before_the_follower_exits(
    stack, settings, pg_connect, tmp_path
) -> None:
    topic, table = stack["ONCEFLOW_TEST_TOPIC"], stack["ONCEFLOW_TEST_TABLE"]
    name = f"{stack['ONCEFLOW_TEST_PIPELINE']}-replica"
    pause = tmp_path / "pause"
    follower = _start_follower(stack, pause)
    try:
        produce(settings.kafka_bootstrap, topic, orders(0, 20))
        wait_while_running(lambda: (pause / "paused-before_decision").exists(), "the epoch's pause", follower)
        follower.send_signal(signal.SIGTERM)  # while the epoch waits to be decided
        time.sleep(0.5)
        assert follower.poll() is None, "the follower exited with an epoch in flight"
        (pause / "resume-before_decision").touch()
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert pg_ids(pg_connect, table) == sorted(o["id"] for o in orders(0, 20))
    assert "stopped after 1 committed epoch(s)" in out
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        assert [e.status for e in ledger.epochs(name)] == [EpochStatus.COMMITTED]
