"""Driving the example DAGs through Airflow's own CLI, and reading what their sinks made visible."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping, Sequence

from onceflow.ledger import Epoch, Ledger
from onceflow.offsets import OffsetRange
from onceflow.sources.kafka_metadata import KafkaMetadata
from onceflow.sources.kafka_range import read_range

# Run everything up to the pre-commits, and leave the decision to a later, separate action.
UP_TO_PRECOMMIT = "^(commit|report)$"


def airflow(args: Sequence[str], env: Mapping[str, str], *, timeout: float = 600) -> str:
    """`airflow ARGS`; returns stdout+stderr. The caller checks the outcome in the log and the ledger
    (``airflow tasks test`` exits 0 even when the task fails)."""
    result = subprocess.run(
        ["airflow", *args], env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )
    return (result.stdout or "") + (result.stderr or "") + f"\n[exit {result.returncode}]"


def task_test(env: Mapping[str, str], dag_id: str, task_id: str, run_id: str) -> tuple[int, list[str]]:
    """`airflow tasks test DAG TASK RUN_ID`: its exit status and its output lines in the order written
    (stderr merged into stdout), blank lines left out."""
    result = subprocess.run(
        ["airflow", "tasks", "test", dag_id, task_id, run_id],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
    )
    return result.returncode, [line for line in result.stdout.splitlines() if line.strip()]


def task_state(env: Mapping[str, str], dag_id: str, task_id: str, run_id: str) -> str:
    """The state Airflow's metadata DB records for one task of a run (`airflow tasks state`)."""
    out = airflow(["tasks", "state", dag_id, task_id, run_id], env)
    states = [w for w in out.split() if w in {"success", "failed", "skipped", "up_for_retry", "None"}]
    assert states, out[-2000:]
    return states[-1]


def dags_test(
    env: Mapping[str, str],
    dag_id: str,
    *,
    logical_date: str | None = None,
    conf: Mapping[str, object] | None = None,
    mark_success: str | None = None,
) -> str:
    args = ["dags", "test", dag_id]
    if logical_date:
        args.append(logical_date)
    if conf:
        args += ["--conf", json.dumps(conf)]
    if mark_success:
        args += ["--mark-success-pattern", mark_success]
    return airflow(args, env)


def run_id_of(log: str) -> str:
    """The id of the DAG run that ``airflow dags test`` created, from its log."""
    found = re.search(r"run_id='?((?:manual|scheduled|backfill)__[^,'\s]+)", log)
    assert found, log[-3000:]
    return found.group(1)


def onceflow_lines(log: str) -> list[str]:
    """The task log lines onceflow's operators wrote, without Airflow's decoration."""
    out = []
    for line in log.splitlines():
        if "onceflow: " in line:
            out.append(line.split("onceflow: ", 1)[1].split(" [airflow.", 1)[0].strip())
    return out


def epochs(url: str, pipeline: str) -> list[Epoch]:
    with Ledger.connect(url) as ledger:
        return ledger.epochs(pipeline)


def read_topic(bootstrap: str, topic: str) -> list[bytes]:
    """Every committed value of the topic, as a read_committed consumer sees it."""
    with KafkaMetadata(bootstrap) as metadata:
        parts = metadata.partitions([topic])
    values: list[bytes] = []
    for p in parts:
        values += [
            r.value or b"" for r in read_range(bootstrap, OffsetRange(topic, p.partition, 0, p.stable))
        ]
    return values
