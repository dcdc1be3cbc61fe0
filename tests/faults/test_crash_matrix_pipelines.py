"""The crash matrix on the other pipelines: Avro records in the registry's wire format (a point in a
read task, one after a task's pre-commit and one between the participants' commits, with bad Avro
records mixed in), a CDC mirror (`postgres_changes`) under the commit-side points and a kill inside its
own apply, and the JVM read path with an executor killed while Spark's Kafka source and from_json read.
The records pipeline's matrix on Spark is in `test_crash_matrix`, whose helpers these share.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from onceflow.pipeline import AvroFormat
from tests.faults import harness, invariants
from tests.faults.cdc_mirror import CdcMirror, cdc_mirror
from tests.faults.test_crash_matrix import SKIPS, _run_matrix
from tests.faults.workload import AVRO_BAD_INPUT

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]

# The Avro pipeline's points: the decoding read task, a task that pre-committed, and the commit itself.
AVRO_MATRIX = [
    harness.named_fault(name, SKIPS.get(name, 0))
    for name in ("task_mid_read", "task_after_precommit", "between_commits")
]


@pytest.mark.timeout(600)
def test_named_faults_on_an_avro_pipeline_leave_every_invariant_standing(
    settings, pg, tmp_path, reports
) -> None:
    """Avro records (a folder registry; the reader schema pinned per slice) under SIGKILL: decoding
    in the Python reader of the Spark tasks, dead letters of bad Avro recorded once. No Kafka source on
    the drivers' classpath: Avro records are read by the Python reader on every path."""
    env = {
        "ONCEFLOW_FAULTS_SLICES": "1",
        "ONCEFLOW_FAULTS_TRANSFORM": "tests.faults.pipelines:keep_every_record",
        "ONCEFLOW_FAULTS_FORMAT": "avro",
    }
    scenario = harness.Scenario(harness.RECORDS, tmp_path, settings, env=env)
    assert isinstance(scenario.spec.format, AvroFormat)
    bad = tuple(AVRO_BAD_INPUT)
    faults = [(fault, 30, 2, bad[i : i + 1]) for i, fault in enumerate(AVRO_MATRIX)]
    run = _run_matrix(scenario, pg, faults, reports, "crash-matrix-avro")
    assert run.not_fired == []
    assert run.violations == []
    assert sorted(scenario.workload.bad.values()) == sorted(bad)
    assert [(t.sink, t.delivered) for t in run.records[-1].verdict.tallies] == [
        (sink, 90) for sink in harness.RECORDS_SINKS
    ]


# The CDC pipeline's points, each on the commit side of the mirror: a read task pre-committed (its staged
# changes prepared), the change log committed and the mirror not, the mirror committed and applied but
# the ledger not told, the recovery of a decided epoch dying; and the runner killed inside the mirror's
# own commit (`_killed_inside_the_mirrors_apply`). They run on the local executor (the same task and
# commit code as on Spark, in the runner's process), each fault's epoch reading what the last one left.
CDC_MATRIX = [
    harness.named_fault("task_after_precommit", 1),
    harness.named_fault("between_commits"),
    harness.named_fault("participant_committed", 1),
    harness.named_fault("during_recover"),
]


def _killed_inside_the_mirrors_apply(mirror: CdcMirror) -> bool:
    """The runner SIGKILLed inside the mirror's commit: its staged changes' prepared transactions are
    committed, and the transaction that applies them to the target waits for a lock the test holds on
    the target table. True when the kill landed there (staged changes committed, none applied)."""
    running = mirror.scenario.start("epoch", "--executor", "local", pause="after_decision")
    running.wait()
    table, name = mirror.mirror_table, mirror.scenario.spec.name
    with psycopg.connect(mirror.dsn) as holder:
        holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        (running.folder / "resume-after_decision").touch()
        deadline, waiting = time.monotonic() + 60, False
        while not waiting and time.monotonic() < deadline and running.process.poll() is None:
            time.sleep(0.05)
            with psycopg.connect(mirror.dsn, autocommit=True) as watch:
                found = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND pid <> %s AND position(%s in query) > 0",
                    [holder.info.backend_pid, table],
                ).fetchone()
            waiting = found is not None and found[0] > 0
        running.process.kill()
        running.process.communicate(timeout=60)
        holder.rollback()
    with psycopg.connect(mirror.dsn, autocommit=True) as pg:
        prepared = pg.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE starts_with(gid, %s)", [f"onceflow:{name}:"]
        ).fetchone()
        staged = invariants.staged_changes_left(mirror.scenario.spec, pg)
    return waiting and prepared == (0,) and staged != []


@pytest.mark.timeout(300)
def test_named_faults_on_a_cdc_pipeline_keep_its_mirror_equal_to_the_source(
    settings, pg_database, tmp_path
) -> None:
    """Each fault: new changes at the source, the fault, `recover`; then nothing may be left prepared or
    staged, and the mirror must be the committed changes applied, which (Kafka Connect running
    throughout, nothing re-sent) is the source as of the last of them. At the end, caught up, the
    mirror and the change log are the source."""
    env = {"ONCEFLOW_FAULTS_MAX_RECORDS": "30", "ONCEFLOW_FAULTS_TASK_RECORDS": "3"}
    rounds: list[tuple[str, Any]] = [(f.name, f) for f in CDC_MATRIX]
    rounds.append(("inside_apply", _killed_inside_the_mirrors_apply))
    fired, left = [], []
    with cdc_mirror(pg_database, tmp_path, settings, seed=41, **env) as mirror:
        for name, fault in rounds:
            mirror.wait_for(mirror.change(6))
            if isinstance(fault, harness.Fault):
                steps = mirror.scenario.inject(fault, "local")  # its crashes, then recover
                fired.append(all(s.crashed for s in steps if s.crash is not None))
            else:
                fired.append(fault(mirror))
                mirror.scenario.must(mirror.scenario.run("recover"))
            mirror.check()
            with psycopg.connect(pg_database, autocommit=True) as pg:
                left += [f"{name}, right after recover: {p}" for p in mirror.scenario.leftovers(pg)]
        mirror.quiesce()
        mirror.drain()
        with psycopg.connect(pg_database, autocommit=True) as pg:
            left += mirror.caught_up(pg)
    assert fired == [True] * len(rounds)
    assert mirror.problems == []
    assert left == []
    assert all(c.against_source for c in mirror.checks if c.position > 0)
    assert len({c.position for c in mirror.checks}) >= 3  # the mirror was compared at several points


@pytest.mark.timeout(600)
def test_an_executor_killed_while_the_jvm_reads_and_decodes_leaves_every_invariant_standing(
    settings, pg, tmp_path
) -> None:
    """The JVM read path under SIGKILL: the records pipeline on the warm runtime with JSON decoded by
    Spark's Kafka source and from_json (no fault plan armed, so the slice takes that path), and the
    executor JVM running a read task killed mid-task. Spark retries the task or the epoch aborts; either
    way recovery and catch-up leave every invariant standing, each record delivered once."""
    from local_stack.spark_runtime import SparkRuntime

    from tests.faults import spark_faults

    env = {
        "ONCEFLOW_FAULTS_SLICES": "1",
        "ONCEFLOW_FAULTS_TRANSFORM": "tests.faults.pipelines:keep_every_record",
        "ONCEFLOW_JSON_READ": "jvm",
        "ONCEFLOW_FAULTS_TASK_RECORDS": "2000",  # a few read tasks, each long enough to be hit
        "ONCEFLOW_FAULTS_MAX_RECORDS": "20000",
    }
    scenario = harness.Scenario(harness.RECORDS, tmp_path, settings, env=env)
    runtime = SparkRuntime.from_env()
    scenario.create_topics()
    landed, paths = False, []
    try:
        for _ in range(3):  # a read task may end before it is seen running: more records, again
            scenario.workload.produce(settings.kafka_bootstrap, 2000, aborted=3)
            running = scenario.start("epoch", "--executor", "connect", pause=None)
            if spark_faults.wait_for_task(runtime, running.process):
                landed = "SIGKILLed" in spark_faults.strike("spark_executor", runtime, running.process)
            outcome = running.resume()
            paths += [line for line in outcome.stderr.splitlines() if "read path (" in line]
            if landed:
                break
        runtime.start()  # the killed executor's worker brings another; the runtime is whole again
        scenario.must(scenario.run("recover"))
        scenario.catch_up("connect")
        verdict = scenario.verdict(pg)
    finally:
        scenario.drop(pg)
    assert landed, "no read task was seen running in three epochs"
    assert paths and all("jvm read path" in line for line in paths), paths
    assert verdict.violations == []
    assert all(t.lost == 0 for t in verdict.tallies), verdict.tallies
