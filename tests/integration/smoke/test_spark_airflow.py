"""Spark executors read an exact Kafka range; Airflow submits that Spark job through SparkSubmitOperator."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def mixed_topic(settings, make_topic) -> tuple[str, list[tuple[int, str]]]:
    """A topic whose partition holds committed records, an aborted batch and control records.

    Returns the topic and the (offset, value) of every committed record, as a read_committed consumer must
    see them.
    """
    topic = make_topic("smoke-spark")
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)
    delivered: list[tuple[int, str]] = []

    def on_delivery(err, msg) -> None:  # type: ignore[no-untyped-def]
        assert err is None, err
        delivered.append((msg.offset(), msg.value().decode()))

    for batch in range(4):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, value=f"b{batch}-r{i}".encode(), on_delivery=on_delivery)
        producer.flush(30)
        if batch == 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    committed = [(offset, value) for offset, value in delivered if not value.startswith("b2-")]
    return topic, committed


def _expected(committed: list[tuple[int, str]], start: int, until: int) -> list[list[object]]:
    return [[offset, value] for offset, value in committed if start <= offset < until]


def test_spark_executors_read_exact_range(spark_env, mixed_topic, tmp_path) -> None:
    topic, committed = mixed_topic
    start, until = committed[2][0], committed[-2][0]  # cuts through batches and past the aborted one
    output = tmp_path / "out.json"
    result = subprocess.run(
        [
            "spark-submit",
            "--master", "local[2]",
            "--conf", "spark.ui.enabled=false",
            str(ROOT / "spark_jobs" / "smoke_read_range.py"),
            "--topic", topic, "--partition", "0",
            "--from-offset", str(start), "--until-offset", str(until),
            "--read-tasks", "3", "--output", str(output),
        ],
        env=spark_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    data = json.loads(output.read_text())
    assert data["read_tasks"] == 3
    assert data["records"] == _expected(committed, start, until)


def test_airflow_dag_submits_spark_job(airflow_env, mixed_topic, tmp_path) -> None:
    topic, committed = mixed_topic
    until = committed[-1][0] + 2  # the end of the log: last record plus its commit marker
    name = f"dag-out-{tmp_path.name}.json"  # the DAG writes only in $ONCEFLOW_HOME/smoke/
    output = Path(airflow_env["ONCEFLOW_HOME"]) / "smoke" / name
    conf = {"topic": topic, "partition": 0, "from_offset": 0, "until_offset": until, "output": name}
    result = subprocess.run(
        ["airflow", "dags", "test", "onceflow_smoke", "--conf", json.dumps(conf)],
        env=airflow_env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    log = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, log
    assert "SparkSubmitHook" in log or "spark-submit" in log, log
    data = json.loads(output.read_text())
    output.unlink()
    assert data["records"] == _expected(committed, 0, until)
