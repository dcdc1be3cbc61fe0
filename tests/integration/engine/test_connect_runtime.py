"""Epochs processed through the warm Spark runtime: a Spark Connect server on a standalone cluster
(`infra/spark.sh`), with this test process as each slice's driver."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest
from local_stack.spark_runtime import SparkRuntime

from onceflow.config import Settings
from onceflow.engine.connect import forget_session, open_sessions
from onceflow.engine.runner import ProcessFailed, run_epoch
from onceflow.ledger import EpochStatus, Ledger
from onceflow.sinks.files import read_committed_table
from tests.integration.engine.data import (
    ORDERS,
    dead_letter_codes,
    delivered_ids,
    orders,
    pg_ids,
    prepared_count,
    produce,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def spark_remote_url(runtime: SparkRuntime) -> str:
    """The local Spark Connect server, started if it is not running (and left running afterwards)."""
    return runtime.start()


def test_epochs_through_spark_connect_deliver_once_and_reuse_one_session(
    stack, settings, pg_connect, spark_remote_url, capsys
) -> None:
    forget_session(spark_remote_url)  # the first epoch below opens the session: a cold start
    first = orders(0, 40)
    produce(
        settings.kafka_bootstrap,
        stack["ONCEFLOW_TEST_TOPIC"],
        first,
        abort=orders(1000, 5),
        bad=[b"{not json", b'{"id": "x", "amount": 1.0, "customer": "c"}', b"\xff\xfe"],
    )
    one = run_epoch(ORDERS, Settings.from_env(), executor="connect", spark_remote_url=spark_remote_url)
    assert one.epoch.status == EpochStatus.COMMITTED and one.executor == "connect"
    [session] = open_sessions(spark_remote_url)
    expected = sorted(o["id"] for o in first if o["amount"] > 0)
    assert delivered_ids(pg_connect, stack) == (expected, expected)
    assert dead_letter_codes(stack) == ["malformed_json", "not_utf8", "wrong_type"]

    second = orders(40, 25)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], second)
    two = run_epoch(ORDERS, Settings.from_env(), executor="connect", spark_remote_url=spark_remote_url)
    assert two.epoch.number == 2 and two.epoch.status == EpochStatus.COMMITTED
    [again] = open_sessions(spark_remote_url)
    assert again is session  # the same warm session, not a new one
    expected = sorted(expected + [o["id"] for o in second if o["amount"] > 0])
    assert delivered_ids(pg_connect, stack) == (expected, expected)
    assert prepared_count(pg_connect, stack["ONCEFLOW_TEST_PIPELINE"]) == 0
    with capsys.disabled():
        for name, outcome in (("first (opens the session)", one), ("second (warm)", two)):
            steps = ", ".join(f"{k} {v:.2f} s" for k, v in outcome.steps.items())
            print(f"\n[connect] {name} epoch: {outcome.seconds:.2f} s ({steps})")


def _python_workers(runtime: SparkRuntime) -> int:
    """Python processes (daemons and workers) under the warm runtime's executors."""

    count = 0
    for pid in runtime.executor_pids():
        try:
            count += len(psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            continue
    return count


def test_processes_of_one_pipeline_join_one_session_and_leave_no_python_workers_behind(
    stack, settings, pg_connect, spark_remote_url, runtime
) -> None:
    """Each Airflow process task is a new client process. They all join the pipeline's one session on
    the server, so the executors' Python workers stay as many as after the first epoch (a session per
    process would add a Python worker per executor each time: Spark keeps them, SPARK-54055)."""
    env = {**os.environ, "ONCEFLOW_SPARK_REMOTE": spark_remote_url, "PYTHONPATH": str(ROOT)}
    joined, workers = [], []
    for n in range(3):
        produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(100 * n, 20))
        done = subprocess.run(
            [sys.executable, "-m", "tests.faults.driver", "epoch", ORDERS, "--executor", "connect"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        joined += re.findall(r"joined the Spark Connect session (\S+)", done.stderr)
        workers.append(_python_workers(runtime))
    assert len(joined) == 3 and len(set(joined)) == 1, joined
    # Idle workers may end; none may be added (a session per process: 40 -> 42 -> 46 here).
    assert workers[0] > 0 and max(workers[1:]) <= workers[0], workers
    expected = sorted(o["id"] for n in range(3) for o in orders(100 * n, 20) if o["amount"] > 0)
    assert delivered_ids(pg_connect, stack) == (expected, expected)


def _write_module(folder: Path, name: str, table_root: Path, stack: dict[str, str]) -> None:
    """A pipeline whose spec and transform exist only in ``folder``; the transform runs a Python UDF
    defined in it, so the server's Python workers must import the module (with the server's
    environment: the names are written into the source)."""
    folder.mkdir(parents=True)
    (folder / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            from pyspark.sql import functions as F

            from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec


            def size_of(amount):
                return "big" if amount >= 3 else "small"


            def label(frame):
                return frame.select("id", F.udf(size_of, "string")(frame.amount).alias("size"))


            PIPELINE = Pipeline(
                name={stack["ONCEFLOW_TEST_PIPELINE"] + "-sizes"!r},
                source=KafkaSource(topics=({stack["ONCEFLOW_TEST_TOPIC"]!r},)),
                format=JsonFormat(schema={{"id": "int", "amount": "float", "customer": "string"}}),
                transform="{name}:label",
                sinks=(SinkSpec("sizes", "files", {{"root": {str(table_root)!r}, "table": "sizes"}}),),
                slices=1,
            )
            """
        )
    )


def test_a_pipeline_module_outside_the_servers_path_reaches_its_workers(
    stack, settings, tmp_path, monkeypatch, spark_remote_url
) -> None:
    name = f"sizes_{uuid.uuid4().hex[:8]}"
    _write_module(tmp_path / "elsewhere", name, tmp_path / "sizes", stack)
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    batch = orders(0, 12)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], batch)
    outcome = run_epoch(
        f"{name}:PIPELINE", Settings.from_env(), executor="connect", spark_remote_url=spark_remote_url
    )
    assert outcome.epoch.status == EpochStatus.COMMITTED
    table = read_committed_table(tmp_path / "sizes", "sizes")
    got = sorted(zip(table.column("id").to_pylist(), table.column("size").to_pylist(), strict=True))
    assert got == [(o["id"], "big" if o["amount"] >= 3 else "small") for o in batch]


def test_a_failing_transform_aborts_the_epoch_and_leaves_nothing_prepared(
    stack, settings, tmp_path, monkeypatch, pg_connect, spark_remote_url
) -> None:
    name = f"broken_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    # The ORDERS sinks, but a transform whose UDF fails on the executors after the reads.
    (folder / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            from dataclasses import replace

            from pyspark.sql import functions as F

            from tests.integration.engine.pipelines import orders_pipeline


            def refuse(amount):
                raise ValueError("amount refused by the test transform")


            def broken(frame):
                return frame.select("id", F.udf(refuse, "double")(frame.amount).alias("amount"), "customer")


            PIPELINE = replace(orders_pipeline(), transform="{name}:broken")
            """
        )
    )
    monkeypatch.syspath_prepend(str(folder))
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(0, 10))
    started = time.monotonic()
    with pytest.raises(ProcessFailed, match="amount refused by the test transform"):
        run_epoch(
            f"{name}:PIPELINE", Settings.from_env(), executor="connect", spark_remote_url=spark_remote_url
        )
    assert time.monotonic() - started < 120
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        (epoch,) = ledger.epochs(stack["ONCEFLOW_TEST_PIPELINE"])
    assert epoch.status == EpochStatus.ABORTED
    assert "amount refused by the test transform" in (epoch.abort_reason or "")
    table = stack["ONCEFLOW_TEST_TABLE"]
    assert not _table_exists(pg_connect, table) or pg_ids(pg_connect, table) == []
    assert prepared_count(pg_connect, stack["ONCEFLOW_TEST_PIPELINE"]) == 0
    # The session survives a failed slice, and the next epoch replays the aborted one's range.
    again = run_epoch(ORDERS, Settings.from_env(), executor="connect", spark_remote_url=spark_remote_url)
    assert again.epoch.status == EpochStatus.COMMITTED and again.epoch.number == 2
    assert pg_ids(pg_connect, table) == sorted(o["id"] for o in orders(0, 10) if o["amount"] > 0)


def _table_exists(pg_connect, table: str) -> bool:  # type: ignore[no-untyped-def]
    row = pg_connect(autocommit=True).execute("SELECT to_regclass(%s)", (table,)).fetchone()
    return row[0] is not None
