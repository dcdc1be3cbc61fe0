"""Speculative execution for real: two attempts of one task pre-commit, exactly one wins.

The test starts a second standalone cluster of `infra/spark.sh` (its own master, two workers and a
Spark Connect server, on free ports) with ``spark.speculation=true``. Its two workers bind to distinct
loopback addresses, because Spark never runs a speculative copy on the host of the first attempt.
The cluster's processes carry the pause point ``task_after_precommit``: the first write task to
pre-commit (a prepared PostgreSQL transaction) waits there, long after its siblings finished. So Spark
speculates it on the other host; the copy passes the point (only the first hit pauses), pre-commits
too and wins. The slow attempt is then killed with its prepared transaction still in PostgreSQL.

Asserted from the outputs: every good record once in both sinks, the losing attempt's prepared
transaction rolled back by the commit, no staged file left, and recover finding nothing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_stack.ports import consecutive_free_ports, free_ports
from local_stack.spark_runtime import SparkRuntime

from onceflow.config import Settings
from onceflow.engine.connect import forget_session
from onceflow.engine.runner import run_epoch
from onceflow.faults import PAUSE_AT_ENV, PAUSE_DIR_ENV
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import load_pipeline
from onceflow.protocol.planning import committers_for
from onceflow.sinks.postgres_2pc import GidParts, parse_gid
from onceflow.testing import coordinator_for_tests
from tests.integration.engine.data import delivered_ids, orders, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPECULATIVE = "tests.integration.engine.pipelines:SPECULATIVE"
POINT = "task_after_precommit"
# Speculate a task once half of its stage finished and it ran twice as long as their median (at
# least a second). The efficiency check is off: the paused attempt has read its input and would look
# efficient to it.
SPECULATION = (
    "spark.speculation=true spark.speculation.interval=200ms spark.speculation.quantile=0.5 "
    "spark.speculation.multiplier=2 spark.speculation.minTaskRuntime=1s "
    "spark.speculation.efficiency.enabled=false"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SparkRuntime, str, Path]]:
    """A speculating cluster on two loopback hosts, its processes armed with the pause point: the
    runtime, its remote and the pause folder."""
    home = tmp_path_factory.mktemp("speculation")
    pause = home / "pause"
    connect, master, ui = free_ports(3)
    env = {
        **os.environ,
        "ONCEFLOW_SPARK_DATA": str(home / "spark"),
        "ONCEFLOW_SPARK_CONNECT_PORT": str(connect),
        "ONCEFLOW_SPARK_MASTER_PORT": str(master),
        "ONCEFLOW_SPARK_MASTER_UI_PORT": str(consecutive_free_ports(3)),
        "ONCEFLOW_SPARK_UI_PORT": str(ui),
        "ONCEFLOW_SPARK_WORKER_HOSTS": "127.0.0.2 127.0.0.3",
        "ONCEFLOW_SPARK_CONF": SPECULATION,
        PAUSE_AT_ENV: POINT,
        PAUSE_DIR_ENV: str(pause),
    }
    runtime = SparkRuntime.from_env(env)
    try:
        remote = runtime.start()
        yield runtime, remote, pause
        forget_session(remote, release=False)
    finally:
        pause.mkdir(exist_ok=True)
        (pause / f"resume-{POINT}").touch()  # a paused attempt still alive ends its wait
        runtime.stop(kill=True)


def _attempt(task: dict) -> str:  # type: ignore[type-arg]
    """A Spark task attempt as the write task names it: stage, partition, task attempt id."""
    return f"{task['stageId']}.{task['index']}.{task['taskId']}"


def _prepared(pg_connect, pipeline: str) -> set[GidParts]:  # type: ignore[no-untyped-def]
    """The pipeline's prepared transactions in PostgreSQL, by their gids' parts."""
    with pg_connect(autocommit=True) as conn:
        gids = [gid for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()]
    return {parts for parts in map(parse_gid, gids) if parts is not None and parts.pipeline == pipeline}


def test_two_attempts_of_a_speculated_task_precommit_and_exactly_one_wins(
    stack, settings, pg_connect, cluster
) -> None:
    data = orders(0, 60)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], data)
    runtime, remote, pause = cluster
    spec = load_pipeline(SPECULATIVE)
    seen: set[GidParts] = set()
    done = threading.Event()

    def watch() -> None:
        """Every prepared transaction of the epoch, polled until its commit."""
        while not done.is_set():
            seen.update(_prepared(pg_connect, spec.name))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        outcome = run_epoch(SPECULATIVE, Settings.from_env(), executor="connect", spark_remote_url=remote)
    finally:
        done.set()
        watcher.join(10)
    assert (pause / f"paused-{POINT}").exists(), "no write task reached the pause point"
    assert outcome.epoch.status is EpochStatus.COMMITTED

    # Spark ran a speculative copy of the slow task on the other host; the copy won, the slow attempt
    # was killed. Both pre-committed: each prepared its own transaction for the same participant.
    tasks = runtime.task_attempts()
    prepared_attempts = {p.attempt for p in seen if p.sink == "orders_pg"}
    pairs = [
        (copy, slow)
        for copy in tasks
        if copy.get("speculative") and copy["status"] == "SUCCESS"
        for slow in tasks
        if (slow["stageId"], slow["index"]) == (copy["stageId"], copy["index"])
        and not slow.get("speculative")
    ]
    both = [(c, s) for c, s in pairs if {_attempt(c), _attempt(s)} <= prepared_attempts]
    assert len(both) == 1, (pairs, prepared_attempts)
    [(copy, slow)] = both
    # Spark kills the slow attempt once the copy succeeded; the kill reaches a Python worker paused in
    # the write task a moment later, and the epoch may commit before it lands (one job per slice).
    deadline = time.monotonic() + 60
    while slow["status"] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
        slow = next(t for t in runtime.task_attempts() if t["taskId"] == slow["taskId"])
    assert slow["status"] == "KILLED" and slow["host"] != copy["host"], (slow, copy)

    # Exactly one won: the ledger registered the copy's attempt, and every good record is there once.
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        registered = {p.attempt for p in ledger.participants(spec.name, outcome.epoch.number)}
        report = coordinator_for_tests(ledger, spec.name, committers_for(spec, Settings.from_env())).recover()
    assert _attempt(copy) in registered and _attempt(slow) not in registered
    expected = sorted(o["id"] for o in data if o["amount"] > 0)
    assert delivered_ids(pg_connect, stack) == (expected, expected)
    # The loser's prepared transaction was rolled back; nothing is staged; recover finds nothing.
    assert _prepared(pg_connect, spec.name) == set()
    assert list(Path(stack["ONCEFLOW_TEST_FILES"]).glob("_staging/**/*.parquet")) == []
    assert report.orphans_aborted == ()
