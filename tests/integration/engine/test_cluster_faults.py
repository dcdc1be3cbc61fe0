"""Faults of the warm Spark runtime itself, mid-epoch, on the standalone cluster of `infra/spark.sh`:
a worker machine lost (its worker, executor and Python workers SIGKILLed), the Spark Connect server
SIGKILLed and restarted, and the slice's driver (the Connect client) SIGKILLed mid-query.

Each fault is made to land while the epoch's tasks run (the pipeline's tasks take seconds, and the
kill waits for Spark's REST API to show them running), and each test checks from the outputs that every
good record is delivered exactly once, that nothing is left prepared and that recover finds nothing.
These tests restart what they kill; they run after the other Spark Connect tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from local_stack.spark_runtime import SparkRuntime

from onceflow.config import Settings
from onceflow.engine.connect import forget_session
from onceflow.engine.runner import ProcessFailed, run_epoch
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import load_pipeline
from onceflow.protocol.planning import committers_for
from onceflow.testing import coordinator_for_tests
from tests.integration.engine.data import delivered_ids, orders, prepared_count, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
SLOW = "tests.integration.engine.pipelines:SLOW"


@pytest.fixture(scope="module")
def runtime() -> SparkRuntime:
    """The warm runtime of the local stack."""
    return SparkRuntime.from_env()


@pytest.fixture(scope="module")
def remote(runtime: SparkRuntime) -> str:
    """Its Spark Connect remote, once it runs (started if it is not running)."""
    return runtime.start()


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.1)


def _executor_of_worker(worker_pid: int) -> tuple[psutil.Process, str]:
    """The executor JVM that a worker started for the Connect server, and its Spark executor id."""
    for child in psutil.Process(worker_pid).children():
        try:
            cmdline = child.cmdline()
        except psutil.Error:  # an executor that ended (a zombie until the worker reaps it)
            continue
        if "--executor-id" in cmdline:
            return child, cmdline[cmdline.index("--executor-id") + 1]
    raise AssertionError(f"worker {worker_pid} runs no executor")


def _expected(records: list[dict]) -> list[int]:  # type: ignore[type-arg]
    return sorted(o["id"] for o in records if o["amount"] > 0)


def _nothing_left(stack: dict[str, str], pg_connect, pipeline: str) -> None:  # type: ignore[no-untyped-def]
    assert prepared_count(pg_connect, pipeline) == 0
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        spec = load_pipeline(SLOW)
        report = coordinator_for_tests(ledger, spec.name, committers_for(spec, Settings.from_env())).recover()
    assert report.orphans_aborted == ()
    assert list(Path(stack["ONCEFLOW_TEST_FILES"]).glob("_staging/**/*.parquet")) == []


def test_a_worker_lost_mid_epoch_costs_a_retry_and_one_attempt_per_task_wins(
    stack, settings, pg_connect, runtime, remote
) -> None:
    data = orders(0, 60)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], data)
    worker = psutil.Process(runtime.pid("worker-1"))
    executor, executor_id = _executor_of_worker(worker.pid)
    failed_before = runtime.failed_tasks()
    killed: list[int] = []

    def lose_the_machine() -> None:
        _wait_for(lambda: runtime.active_tasks(executor_id) > 0, 120, "a task on worker 1's executor")
        for process in (worker, executor, *executor.children(recursive=True)):
            with_pid = process.pid
            os.kill(with_pid, signal.SIGKILL)
            killed.append(with_pid)

    killer = threading.Thread(target=lose_the_machine, daemon=True)
    killer.start()
    try:
        outcome = run_epoch(SLOW, Settings.from_env(), executor="connect", spark_remote_url=remote)
        killer.join(5)
        assert killed, "the worker was not killed while a task ran on it"
        assert outcome.epoch.status is EpochStatus.COMMITTED
        assert runtime.failed_tasks() > failed_before  # its running tasks failed and ran again elsewhere
        expected = _expected(data)
        assert delivered_ids(pg_connect, stack) == (expected, expected)
        _nothing_left(stack, pg_connect, load_pipeline(SLOW).name)
    finally:
        runtime.start()


def test_the_connect_server_killed_mid_epoch_aborts_it_and_the_next_epoch_replays_it(
    stack, settings, pg_connect, runtime, remote
) -> None:
    data = orders(0, 60)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], data)
    server = runtime.pid("connect")
    assert server is not None

    def kill_the_server() -> None:
        _wait_for(lambda: runtime.active_tasks() > 0, 120, "a running task")
        os.kill(server, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_server, daemon=True)
    killer.start()
    try:
        with pytest.raises(ProcessFailed):
            run_epoch(SLOW, Settings.from_env(), executor="connect", spark_remote_url=remote)
    finally:
        killer.join(5)
        runtime.start()
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE
    pipeline = load_pipeline(SLOW).name
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        [aborted] = ledger.epochs(pipeline)
    assert aborted.status is EpochStatus.ABORTED
    assert prepared_count(pg_connect, pipeline) == 0

    replay = run_epoch(SLOW, Settings.from_env(), executor="connect", spark_remote_url=remote)
    assert replay.epoch.status is EpochStatus.COMMITTED and replay.epoch.ranges == aborted.ranges
    expected = _expected(data)
    assert delivered_ids(pg_connect, stack) == (expected, expected)
    _nothing_left(stack, pg_connect, pipeline)


def test_a_client_killed_mid_query_leaves_its_queries_interrupted_and_nothing_recover_misses(
    stack, settings, pg_connect, runtime, remote
) -> None:
    data = orders(0, 60)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], data)
    env = {**os.environ, "ONCEFLOW_SPARK_REMOTE": remote, "PYTHONPATH": str(ROOT)}
    client = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.driver", "epoch", SLOW, "--executor", "connect"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(lambda: runtime.active_tasks() > 0, 180, "a running task of the client's epoch")
        client.send_signal(signal.SIGKILL)
        client.wait(30)
        # The server notices the client is gone and interrupts its detached queries.
        _wait_for(lambda: runtime.active_tasks() == 0, 120, "the interruption of the dead client's queries")
    finally:
        if client.poll() is None:
            client.kill()
    forget_session(remote)

    pipeline = load_pipeline(SLOW).name
    after = run_epoch(SLOW, Settings.from_env(), executor="connect", spark_remote_url=remote)
    # The dead client's epoch was found and rolled back by this run's recover.
    assert (after.recovery.epoch, after.recovery.outcome) == (1, "aborted"), after.recovery.summary()
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        statuses = [e.status for e in ledger.epochs(pipeline)]
    assert statuses == [EpochStatus.ABORTED, EpochStatus.COMMITTED]
    expected = _expected(data)
    assert delivered_ids(pg_connect, stack) == (expected, expected)
    _nothing_left(stack, pg_connect, pipeline)
