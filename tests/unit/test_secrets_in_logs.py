"""A Spark Connect URL's token stays out of the lines that name the server: the process operator's
"where" line and the session lines of `onceflow.engine.connect`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.engine import connect
from onceflow.pipeline import load_pipeline
from tests.unit.test_process_runtime import operator  # noqa: F401 - the fixture

SECRET = "s3cr3t-PW-1234"


def test_the_process_operator_names_the_server_without_its_token(operator, monkeypatch) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    monkeypatch.delenv("ONCEFLOW_EXECUTOR", raising=False)
    monkeypatch.setenv(
        "AIRFLOW_CONN_MY_CONNECT",
        json.dumps({"conn_type": "spark_connect", "host": "cluster", "port": 443, "password": SECRET}),
    )
    process = operator(spark_connect_conn_id="my_connect")
    spec = load_pipeline("examples.orders.pipeline:ORDERS")
    in_task = process.slice_in_task(spec, "attempt-token", Settings.from_env({}))
    assert in_task is not None
    assert in_task[0] == "on the Spark Connect server sc://cluster:443/;token=***"


class FakeSession:
    def __init__(self) -> None:
        self.conf = self
        self.release_session_on_close = False

    def set(self, key: str, value: Any) -> None: ...

    def stop(self) -> None: ...


def test_session_lines_name_the_server_without_its_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(connect, "_open", lambda url: FakeSession())
    remote = f"sc://spark:15002/;token={SECRET}"
    try:
        connect.warm_session(remote)  # a private session
        connect.warm_session(remote, "pipeline\0modules")  # a joined one
    finally:
        connect.forget_session(remote, release=False)
    err = capsys.readouterr().err
    assert "opening a Spark Connect session on sc://spark:15002/;token=***" in err
    assert "on sc://spark:15002/;token=***" in err.split("joined the Spark Connect session", 1)[1]
    assert SECRET not in err
