"""Where a DAG's process task runs its slice: the spark_connect connection, else ONCEFLOW_SPARK_REMOTE,
else spark-submit (the operator's choice is made when the task runs, from Airflow's own connections)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from onceflow.config import Settings

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
    assert operator().spark_remote(Settings.from_env()) == "sc://spark-connect:15002/"


def test_another_connection_id_and_its_token(operator, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(
        "AIRFLOW_CONN_MY_CONNECT",
        json.dumps({"conn_type": "spark_connect", "host": "cluster", "port": 443, "password": "t0ken"}),
    )
    remote = operator(spark_connect_conn_id="my_connect").spark_remote(Settings.from_env())
    assert remote == "sc://cluster:443/;token=t0ken"


def test_the_variable_then_spark_submit(operator, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    assert operator().spark_remote(Settings.from_env()) is None  # neither: spark-submit through spark_default
    monkeypatch.setenv("ONCEFLOW_SPARK_REMOTE", "sc://from-variable:15002")
    assert operator().spark_remote(Settings.from_env()) == "sc://from-variable:15002"
    monkeypatch.setenv("ONCEFLOW_SPARK_REMOTE", "spark://not-connect:7077")
    with pytest.raises(Exception, match="not a Spark Connect URL"):
        operator().spark_remote(Settings.from_env())


# (configured executor, spark_connect connection, ONCEFLOW_SPARK_REMOTE) -> how the slice runs.
CONNECTION = "sc://spark-connect:15002/"
VARIABLE = "sc://from-variable:15002"
CHOICES = [
    ("spark", None, None, "submit"),
    ("spark", None, VARIABLE, "connect"),
    ("spark", CONNECTION, None, "connect"),
    ("connect", CONNECTION, VARIABLE, "connect"),
    ("connect", None, None, "refused"),
    ("submit", CONNECTION, VARIABLE, "submit"),
    ("local", CONNECTION, VARIABLE, "local"),
]


@pytest.mark.parametrize(("executor", "connection", "variable", "expected"), CHOICES)
def test_the_task_and_onceflow_run_choose_alike(  # type: ignore[no-untyped-def]
    operator,
    monkeypatch: pytest.MonkeyPatch,
    executor: str,
    connection: str | None,
    variable: str | None,
    expected: str,
) -> None:
    """The process task (with its connection) and `run_epoch` (given that server) ask the same rule
    from the same settings and come to the same choice."""
    from onceflow.engine import runner
    from onceflow.errors import ConfigError

    settings = Settings.from_env({"ONCEFLOW_EXECUTOR": executor, "ONCEFLOW_SPARK_REMOTE": variable or ""})
    if connection is not None:
        monkeypatch.setenv(
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
            json.dumps({"conn_type": "spark_connect", "host": "sc://spark-connect", "port": 15002}),
        )

    def choice(decide: Callable[[], object]) -> object:
        try:
            return decide()
        except ConfigError:
            return "refused"

    in_task = choice(lambda: operator().slice_runner(settings)[0])

    class Chosen(Exception):
        pass

    seen: list[object] = []
    rule = runner.slice_runner_for

    def recorded(*args: Any, **kwargs: Any) -> Any:
        seen.append(choice(lambda: rule(*args, **kwargs)[0]))
        return rule(*args, **kwargs)

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise Chosen

    monkeypatch.setattr(runner, "slice_runner_for", recorded)
    monkeypatch.setattr(runner, "check_local", lambda spec: None)
    monkeypatch.setattr(runner.Ledger, "connect", stop)
    with pytest.raises((Chosen, ConfigError)):  # stops once the runner has chosen
        runner.run_epoch("examples.orders.pipeline:ORDERS", settings, spark_remote_url=connection)
    assert seen == [in_task] == [expected]
