"""Faults of the warm Spark runtime itself, mid-epoch, on the standalone cluster of `infra/spark.sh`:
a worker machine lost (its worker, executor and Python workers SIGKILLed), the Spark Connect server
SIGKILLed and restarted, and the slice's driver (the Connect client) SIGKILLed mid-query.

Each fault is made to land while the epoch's tasks run (the pipeline's tasks take seconds, and the
kill waits for Spark's REST API to show them running), and each test checks from the outputs that every
good record is delivered exactly once, that nothing is left prepared and that recover finds nothing.
These tests restart what they kill; they run after the other Spark Connect tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from onceflow.config import Settings
from onceflow.coordinator import Coordinator, committers_for
from onceflow.engine.connect import forget_session
from onceflow.engine.runner import ProcessFailed, run_epoch
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import load_pipeline
from tests.integration.engine.data import delivered_ids, orders, prepared_count, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
SLOW = "tests.integration.engine.pipelines:SLOW"
ENV_SH = ROOT / "infra" / "env.sh"


def _runtime_setting(name: str) -> str:
    """A setting of the warm runtime as infra/env.sh resolves it (the variable, else its default)."""
    shown = subprocess.run(
        ["bash", "-c", f'. "{ENV_SH}" && printf %s "${name}"'], capture_output=True, text=True, check=True
    )
    return shown.stdout


@pytest.fixture(scope="module")
def runtime() -> dict[str, str]:
    """The running warm runtime: its remote, pid folder and REST API (started if it is not running)."""
    started = subprocess.run([str(ROOT / "infra" / "spark.sh"), "start"], capture_output=True, text=True)
    assert started.returncode == 0, started.stderr[-3000:]
    remote = started.stdout.strip().splitlines()[-1].split("=", 1)[1]
    return {
        "remote": remote,
        "pids": _runtime_setting("ONCEFLOW_SPARK_DATA"),
        "api": f"http://127.0.0.1:{_runtime_setting('ONCEFLOW_SPARK_UI_PORT')}/api/v1/applications",
    }


def _restart(runtime: dict[str, str]) -> None:
    """Start again whatever a test killed (infra/spark.sh start leaves running processes alone); its pid
    files are where the module found them, whatever ONCEFLOW_HOME the test's stack points at."""
    env = {**os.environ, "ONCEFLOW_SPARK_DATA": runtime["pids"]}
    started = subprocess.run(
        [str(ROOT / "infra" / "spark.sh"), "start"], capture_output=True, text=True, env=env
    )
    assert started.returncode == 0, started.stderr[-3000:]


def _pid(runtime: dict[str, str], name: str) -> int:
    return int(Path(runtime["pids"], f"{name}.pid").read_text().split()[0])


def _api(runtime: dict[str, str], path: str) -> list[dict]:  # type: ignore[type-arg]
    with urllib.request.urlopen(runtime["api"], timeout=5) as answer:
        app = json.load(answer)[0]["id"]
    with urllib.request.urlopen(f"{runtime['api']}/{app}/{path}", timeout=5) as answer:
        return list(json.load(answer))


def _active_tasks(runtime: dict[str, str], executor_id: str | None = None) -> int:
    try:
        executors = _api(runtime, "executors")
    except (OSError, ValueError, LookupError):
        return 0
    return sum(e["activeTasks"] for e in executors if e["id"] != "driver" and executor_id in (None, e["id"]))


def _failed_tasks(runtime: dict[str, str]) -> int:
    return sum(stage["numFailedTasks"] for stage in _api(runtime, "stages"))


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
        report = Coordinator(ledger, spec.name, committers_for(spec)).recover()
    assert report.orphans_aborted == ()
    assert list(Path(stack["ONCEFLOW_TEST_FILES"]).glob("_staging/**/*.parquet")) == []


def test_a_worker_lost_mid_epoch_costs_a_retry_and_one_attempt_per_task_wins(
    stack, settings, pg_connect, runtime
) -> None:
    data = orders(0, 60)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], data)
    worker = psutil.Process(_pid(runtime, "worker-1"))
    executor, executor_id = _executor_of_worker(worker.pid)
    failed_before = _failed_tasks(runtime)
    killed: list[int] = []

    def lose_the_machine() -> None:
        _wait_for(lambda: _active_tasks(runtime, executor_id) > 0, 120, "a task on worker 1's executor")
        for process in (worker, executor, *executor.children(recursive=True)):
            with_pid = process.pid
            os.kill(with_pid, signal.SIGKILL)
            killed.append(with_pid)

    killer = threading.Thread(target=lose_the_machine, daemon=True)
    killer.start()
    try:
        outcome = run_epoch(SLOW, Settings.from_env(), executor="connect", spark_remote_url=runtime["remote"])
        killer.join(5)
        assert killed, "the worker was not killed while a task ran on it"
        assert outcome.epoch.status is EpochStatus.COMMITTED
        assert _failed_tasks(runtime) > failed_before  # its running tasks failed and ran again elsewhere
        expected = _expected(data)
        assert delivered_ids(pg_connect, stack) == (expected, expected)
        _nothing_left(stack, pg_connect, load_pipeline(SLOW).name)
    finally:
        _restart(runtime)


def test_the_connect_server_killed_mid_epoch_aborts_it_and_the_next_epoch_replays_it(
    stack, settings, pg_connect, runtime
) -> None:
    data = orders(0, 60)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], data)
    server = _pid(runtime, "connect")

    def kill_the_server() -> None:
        _wait_for(lambda: _active_tasks(runtime) > 0, 120, "a running task")
        os.kill(server, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_server, daemon=True)
    killer.start()
    try:
        with pytest.raises(ProcessFailed):
            run_epoch(SLOW, Settings.from_env(), executor="connect", spark_remote_url=runtime["remote"])
    finally:
        killer.join(5)
        _restart(runtime)
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE
    pipeline = load_pipeline(SLOW).name
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        [aborted] = ledger.epochs(pipeline)
    assert aborted.status is EpochStatus.ABORTED
    assert prepared_count(pg_connect, pipeline) == 0

    replay = run_epoch(SLOW, Settings.from_env(), executor="connect", spark_remote_url=runtime["remote"])
    assert replay.epoch.status is EpochStatus.COMMITTED and replay.epoch.ranges == aborted.ranges
    expected = _expected(data)
    assert delivered_ids(pg_connect, stack) == (expected, expected)
    _nothing_left(stack, pg_connect, pipeline)


def test_a_client_killed_mid_query_leaves_its_queries_interrupted_and_nothing_recover_misses(
    stack, settings, pg_connect, runtime
) -> None:
    data = orders(0, 60)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], data)
    env = {**os.environ, "ONCEFLOW_SPARK_REMOTE": runtime["remote"], "PYTHONPATH": str(ROOT)}
    client = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.driver", "epoch", SLOW, "--executor", "connect"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(lambda: _active_tasks(runtime) > 0, 180, "a running task of the client's epoch")
        client.send_signal(signal.SIGKILL)
        client.wait(30)
        # The server notices the client is gone and interrupts its detached queries.
        _wait_for(lambda: _active_tasks(runtime) == 0, 120, "the interruption of the dead client's queries")
    finally:
        if client.poll() is None:
            client.kill()
    forget_session(runtime["remote"])

    pipeline = load_pipeline(SLOW).name
    after = run_epoch(SLOW, Settings.from_env(), executor="connect", spark_remote_url=runtime["remote"])
    # The dead client's epoch was found and rolled back by this run's recover.
    assert (after.recovery.epoch, after.recovery.outcome) == (1, "aborted"), after.recovery.summary()
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        statuses = [e.status for e in ledger.epochs(pipeline)]
    assert statuses == [EpochStatus.ABORTED, EpochStatus.COMMITTED]
    expected = _expected(data)
    assert delivered_ids(pg_connect, stack) == (expected, expected)
    _nothing_left(stack, pg_connect, pipeline)
