"""Where a DAG's process task runs its slice: the spark_connect connection, else ONCEFLOW_SPARK_REMOTE,
else spark-submit (the operator's choice is made when the task runs, from Airflow's own connections)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def operator(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(os, "environ", os.environ.copy())
    for key in [k for k in os.environ if k.startswith("AIRFLOW_CONN_SPARK_CONNECT")] + [
        "ONCEFLOW_SPARK_REMOTE"
    ]:
        monkeypatch.delenv(key, raising=False)
    sys.path.insert(0, str(ROOT / "plugins"))
    from onceflow_airflow.operators import OnceflowProcessOperator

    def make(**kwargs: object) -> OnceflowProcessOperator:
        return OnceflowProcessOperator(
            task_id="process_s0", pipeline="examples.orders.pipeline:PIPELINE", slice_number=0,
            application="unused.py", **kwargs,  # type: ignore[arg-type]
        )  # fmt: skip

    return make


def test_the_spark_connect_connection_wins(operator, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ONCEFLOW_SPARK_REMOTE", "sc://from-variable:15002")
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
        json.dumps({"conn_type": "spark_connect", "host": "sc://spark-connect", "port": 15002}),
    )
    assert operator().spark_remote() == "sc://spark-connect:15002/"


def test_another_connection_id_and_its_token(operator, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(
        "AIRFLOW_CONN_MY_CONNECT",
        json.dumps({"conn_type": "spark_connect", "host": "cluster", "port": 443, "password": "t0ken"}),
    )
    remote = operator(spark_connect_conn_id="my_connect").spark_remote()
    assert remote == "sc://cluster:443/;token=t0ken"


def test_the_variable_then_spark_submit(operator, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    assert operator().spark_remote() is None  # neither: spark-submit through spark_default
    monkeypatch.setenv("ONCEFLOW_SPARK_REMOTE", "sc://from-variable:15002")
    assert operator().spark_remote() == "sc://from-variable:15002"
    monkeypatch.setenv("ONCEFLOW_SPARK_REMOTE", "spark://not-connect:7077")
    with pytest.raises(Exception, match="not a Spark Connect URL"):
        operator().spark_remote()
