"""Epoch ownership: a live runner's epoch is never "recovered", and two runners take turns."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.engine.runner import EpochOutcome, run_epoch
from onceflow.faults import PAUSE_AT_ENV, PAUSE_DIR_ENV
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import load_pipeline
from onceflow.protocol.coordinator import Coordinator
from tests.integration.engine.data import orders, pg_ids, produce, wait_while_running

pytestmark = pytest.mark.integration

REPLICATE = "tests.integration.engine.pipelines:REPLICATE"


def test_recover_and_a_second_runner_leave_a_live_epoch_alone_and_both_make_progress(
    stack, settings, pg_connect, tmp_path
) -> None:
    first = orders(0, 20)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], first)
    pause = tmp_path / "pause"
    pause.mkdir()
    # Runner A holds its epoch at the point where every task has staged but nothing is registered.
    runner_a = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.driver", "epoch", REPLICATE, "--executor", "local"],
        env={**os.environ, PAUSE_AT_ENV: "slice_after_tasks", PAUSE_DIR_ENV: str(pause)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_while_running((pause / "paused-slice_after_tasks").exists, "runner A's pause", runner_a)
        spec = load_pipeline(REPLICATE)
        with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
            # An operator's recover during the live run keeps the epoch and its staging.
            report = Coordinator.for_pipeline(spec, ledger, Settings.from_env()).recover(by="a test")
            live = ledger.open_epoch(spec.name)
        assert live is not None and live.status is EpochStatus.PLANNED
        assert report.outcome == "kept" and report.orphans_aborted == ()
        assert f"pid {runner_a.pid} " in (live.owner or "")

        # Runner B starts meanwhile: it waits for A instead of aborting A's epoch.
        produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(100, 10))
        results: dict[str, Any] = {}

        def run_b() -> None:
            try:
                results["b"] = run_epoch(REPLICATE, Settings.from_env(), executor="local", wait_s=120)
            except Exception as exc:  # reported below
                results["b"] = exc

        runner_b = threading.Thread(target=run_b)
        runner_b.start()
        time.sleep(3)
        assert "b" not in results  # still waiting for A
        (pause / "resume-slice_after_tasks").touch()
        _, err = runner_a.communicate(timeout=120)
        assert runner_a.returncode == 0, err
        runner_b.join(timeout=180)
    finally:
        if runner_a.poll() is None:
            runner_a.kill()
    outcome = results["b"]
    assert isinstance(outcome, EpochOutcome), outcome
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        epochs = ledger.epochs(spec.name)
    assert [e.status for e in epochs] == [EpochStatus.COMMITTED, EpochStatus.COMMITTED]  # nothing aborted
    assert epochs[1].number == outcome.epoch.number
    ids = sorted(o["id"] for o in [*first, *orders(100, 10)])
    assert pg_ids(pg_connect, stack["ONCEFLOW_TEST_TABLE"]) == ids
