"""Named faults on Spark: the records pipeline through spark-submit, SIGKILLed at each point.

Task-level points kill a Spark Python worker (the master allows a retry, so the job may finish); the
slice points kill the Spark driver. After each fault: recovery, catch-up, every invariant. By default
the points inside the Spark job and in its driver run; the coordinator's own points (after the plan, the
decision, the commits), where no Spark job is running, are the same code on every executor and run in
`test_random_faults` with the local executor, through the same committers; ONCEFLOW_FAULTS_MATRIX=all
runs every named fault on Spark (17 faults, about ten minutes on two cores).
Then the bad-input run: every kind of bad record, mixed into the stream, dead-lettered with its reason
and offset while every good record is delivered once and the pipeline keeps going. Both run the
records pipeline (PostgreSQL, files in a folder and in a bucket, Iceberg, Delta, Kafka) with a
transform, with Spark's Kafka source on the drivers' classpath, and check each source partition's order
in the Kafka output and in each data file of the files, Iceberg and Delta sinks. The Avro, CDC and JVM
read path cases are in `test_crash_matrix_pipelines`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.faults import harness
from tests.faults.workload import BAD_INPUT

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]

SPARK_POINTS = (
    "task_mid_read",
    "task_after_stage",
    "task_after_precommit",
    "slice_after_tasks",
    "slice_after_precommits",
)
NAMES = harness.FAULT_NAMES if os.environ.get("ONCEFLOW_FAULTS_MATRIX") == "all" else SPARK_POINTS
# One slice, so each epoch is one spark-submit; skips that hit "some tasks, not all" where it matters.
SKIPS = {"task_after_precommit": 2, "task_mid_read": 1}
MATRIX = [harness.named_fault(name, SKIPS.get(name, 0)) for name in NAMES]


def _on_spark(tmp_path: Path) -> dict[str, str]:
    """One slice, a transform that keeps every partition's rows, and Spark's Kafka source on the
    spark-submit drivers' classpath with JSON read there: the slices without a fault plan run in one
    pass on the JVM path (a fault plan keeps the Python reader, where the task points are)."""
    conf = harness.spark_conf_with_kafka(tmp_path / "spark-conf")
    return {
        "ONCEFLOW_FAULTS_SLICES": "1",
        "ONCEFLOW_FAULTS_TRANSFORM": "tests.faults.pipelines:keep_every_record",
        "SPARK_CONF_DIR": str(conf),
        "ONCEFLOW_JSON_READ": "jvm",
    }


def _run_matrix(
    scenario: harness.Scenario,
    pg: Any,
    faults: list[tuple[harness.Fault, int, int, tuple[str, ...]]],
    reports: Path,
    name: str,
) -> harness.FaultRun:
    """Each fault in turn through spark-submit, then its report as ``name``; the scenario's topics and
    tables are dropped whatever happens."""
    scenario.create_topics()
    try:
        run = harness.run_faults(scenario, pg, faults, executor="submit")
    finally:
        scenario.drop(pg)
    harness.write_report(reports, name, run.to_dict(), harness.run_markdown(run))
    return run


# About 170 s for the five Spark points in CI; every fault (ONCEFLOW_FAULTS_MATRIX=all) takes longer.
@pytest.mark.timeout(max(900, 60 * len(MATRIX)))
def test_named_faults_on_spark_leave_every_invariant_standing(settings, pg, tmp_path, reports) -> None:
    scenario = harness.Scenario(harness.RECORDS, tmp_path, settings, env=_on_spark(tmp_path))
    faults = [(fault, 30, 2, ()) for fault in MATRIX]
    run = _run_matrix(scenario, pg, faults, reports, "crash-matrix-spark")
    assert run.not_fired == []
    assert run.violations == []


def test_bad_input_is_dead_lettered_and_never_stalls_the_pipeline(settings, pg, tmp_path) -> None:
    scenario = harness.Scenario(harness.RECORDS, tmp_path, settings, env=_on_spark(tmp_path))
    scenario.create_topics()
    try:
        for _ in range(2):
            scenario.workload.produce(settings.kafka_bootstrap, 40, aborted=3, bad=tuple(BAD_INPUT))
        epochs = scenario.catch_up("submit")
        verdict = scenario.verdict(pg)
    finally:
        scenario.drop(pg)
    assert epochs == 2  # one epoch read everything, the next found nothing left: no stall
    assert sorted(scenario.workload.bad.values()) == sorted(list(BAD_INPUT) * 2)
    assert verdict.violations == []
    assert [(t.sink, t.delivered, t.lost) for t in verdict.tallies] == [
        (sink, 80, 0) for sink in harness.RECORDS_SINKS
    ]
