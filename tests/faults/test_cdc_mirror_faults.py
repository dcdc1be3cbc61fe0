"""A table mirrored through Debezium, Kafka and onceflow into PostgreSQL (`postgres_changes`, two-phase)
while its processes are SIGKILLed: the runner mid-epoch, a Spark executor mid-task, the Kafka Connect
worker, and PostgreSQL itself (which holds the source, the mirror and the prepared transactions).

Each round changes the source (inserts, updates, deletes; a key updated three times in a row, a key
deleted and inserted again), lands one fault while epochs run, recovers, and catches up. After every
committed epoch (`tests.faults.cdc_mirror.CdcMirror.check`) the mirror must be the committed change events
applied by key, and the source as of the last of them wherever the topic is the source's history; at the
end of each round (the source still, Debezium's last change in the topic, every epoch committed) the
mirror must be the source, row for row, with no prepared transaction and no staged change left.
Killed services are started again by their infra scripts, with the stack's environment.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from onceflow.config import Settings
from tests.faults import harness, spark_faults
from tests.faults.cdc_mirror import (
    CdcMirror,
    cdc_mirror,
    finished,
    infra,
    infra_process,
    restart,
    wait_task_running,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]

CHANGES = 10  # changes per round
# Read tasks of 3 records: a key's changes span tasks of an epoch.
ENV = {"ONCEFLOW_FAULTS_MAX_RECORDS": "20", "ONCEFLOW_FAULTS_TASK_RECORDS": "3"}


@pytest.fixture
def mirror(pg_database: str, tmp_path: Path, settings: Settings) -> Iterator[CdcMirror]:
    with cdc_mirror(pg_database, tmp_path, settings, seed=40, **ENV) as made:
        yield made


def round_end(mirror: CdcMirror) -> list[str]:
    """Wait for Debezium's last change, catch up (the first epoch recovers what the fault left): the
    mirror must be the source."""
    mirror.quiesce()
    mirror.drain()
    with psycopg.connect(mirror.dsn, autocommit=True) as pg:
        return mirror.caught_up(pg)


def runner_killed(mirror: CdcMirror) -> bool:
    """The runner SIGKILLed after some read tasks prepared their staged changes, none registered."""
    outcome = mirror.scenario.epoch("local", harness.Crash("task_after_precommit", 1))
    mirror.check()
    return outcome.crashed


def executor_killed(mirror: CdcMirror) -> bool:
    """An executor of the warm Spark runtime SIGKILLed while it runs a task of the epoch (new changes
    for each try, until a task is seen running); the runtime is then brought back."""
    from local_stack.spark_runtime import SparkRuntime

    runtime = SparkRuntime.from_env()
    landed = False
    try:
        for _ in range(3):
            running = mirror.scenario.start("epoch", "--executor", "connect", pause=None)
            landed = spark_faults.wait_for_task(runtime, running.process)
            if landed:
                landed = "SIGKILLed" in spark_faults.strike("spark_executor", runtime, running.process)
            running.resume()
            mirror.check()
            if landed:
                break
            mirror.wait_for(mirror.change(6))
    finally:
        runtime.start()
    return landed


def connect_killed(mirror: CdcMirror) -> bool:
    """The Kafka Connect worker SIGKILLed as soon as the round's last change is in the topic (its source
    offsets not flushed yet); an epoch runs without it; then it starts again and Debezium resumes from
    the offsets it had flushed, sending again what came after."""
    running = {t["state"] for t in mirror.connector.status()["tasks"]} == {"RUNNING"}
    infra("connect", "stop", "--kill")
    starting = infra_process("connect", "start")  # the worker takes its time; the epoch does not wait
    try:
        mirror.epoch()  # what Debezium wrote before it died
    finally:
        finished(starting)
    wait_task_running(mirror.connector)
    return running


def postgres_killed(mirror: CdcMirror) -> bool:
    """PostgreSQL SIGKILLed (postmaster and backends) while the epoch is decided and its participants
    prepared, and the runner lost with it; the server starts again and `recover` commits them."""
    running = mirror.scenario.start("epoch", "--executor", "local", pause="after_decision")
    try:
        running.wait()
        restart("postgres")
    finally:
        running.process.kill()
        running.process.communicate(timeout=60)
    with psycopg.connect(mirror.dsn, autocommit=True) as pg:
        prepared = pg.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
            [f"onceflow:{mirror.scenario.spec.name}:"],
        ).fetchone()
        recovered = mirror.recover().output["recovered"]
        assert "committed" in str(recovered), recovered
        assert mirror.scenario.leftovers(pg) == []  # nothing prepared or staged is left
    wait_task_running(mirror.connector)
    return prepared is not None and prepared[0] > 0


FAULTS = {
    "runner": runner_killed,
    "spark_executor": executor_killed,
    "kafka_connect": connect_killed,
    "postgres": postgres_killed,
}


@pytest.mark.timeout(600)
def test_a_mirrored_table_equals_its_source_under_sigkills(mirror: CdcMirror) -> None:
    landed: dict[str, bool] = {}
    ends: dict[str, list[str]] = {}
    for name, fault in FAULTS.items():
        started = time.monotonic()
        mirror.wait_for(mirror.change(CHANGES))
        landed[name] = fault(mirror)
        ends[name] = round_end(mirror)
        print(
            f"{name}: landed={landed[name]} {time.monotonic() - started:.1f} s, {len(mirror.checks)} checks"
        )
    print(f"{mirror.resends()} change events re-sent by Debezium; {len(mirror.events)} in the topic")
    assert mirror.problems == []
    assert ends == {name: [] for name in FAULTS}
    assert landed == {name: True for name in FAULTS}
    assert sum(c.against_source for c in mirror.checks) >= len(FAULTS)
