"""The ledger hook: Airflow connections win over ONCEFLOW_* variables, which win over the defaults."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hook_class(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    # Each test gets a copy of the process environment, restored afterwards.
    monkeypatch.setattr(os, "environ", os.environ.copy())
    sys.path.insert(0, str(ROOT / "plugins"))
    from onceflow_airflow.hooks import OnceflowHook

    return OnceflowHook


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, conn: dict[str, object]) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def test_connections_override_the_variables(hook_class, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ONCEFLOW_LEDGER_URL", "sqlite:////from/variable.db")
    monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP", "variable:9092")
    _conn(
        monkeypatch,
        "onceflow_ledger",
        {
            "conn_type": "postgres",
            "host": "db",
            "port": 5433,
            "login": "o f",
            "password": "p@ss",
            "schema": "ledger",
        },
    )
    _conn(
        monkeypatch,
        "onceflow_kafka",
        {"conn_type": "generic", "extra": {"bootstrap.servers": "k1:9092,k2:9092"}},
    )
    _conn(
        monkeypatch,
        "onceflow_postgres",
        {"conn_type": "postgres", "host": "pg", "login": "u", "schema": "sinks"},
    )
    before = dict(os.environ)
    settings = hook_class().settings()
    assert settings.ledger_url == "postgresql+psycopg://o%20f:p%40ss@db:5433/ledger"
    assert settings.kafka_bootstrap == "k1:9092,k2:9092"
    assert settings.pg_dsn == "postgresql://u@pg/sinks"
    # Settings travel explicitly (to sinks and to spark-submit's child environment): the task's own
    # environment is left as it was.
    assert dict(os.environ) == before


def test_a_ledger_url_in_the_extra_and_kafka_host_and_port(
    hook_class, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    _conn(monkeypatch, "other_ledger", {"conn_type": "generic", "extra": {"url": "sqlite:////data/l.db"}})
    _conn(monkeypatch, "other_kafka", {"conn_type": "generic", "host": "broker", "port": 29092})
    settings = hook_class(ledger_conn_id="other_ledger", kafka_conn_id="other_kafka").settings()
    assert settings.ledger_url == "sqlite:////data/l.db"
    assert settings.kafka_bootstrap == "broker:29092"


def test_without_connections_the_variables_are_used(hook_class, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP", "variable:9092")
    monkeypatch.setenv("ONCEFLOW_LEDGER_URL", "sqlite:////from/variable.db")
    settings = hook_class(
        ledger_conn_id="absent_l", kafka_conn_id="absent_k", postgres_conn_id="absent_p"
    ).settings()
    assert (settings.kafka_bootstrap, settings.ledger_url) == ("variable:9092", "sqlite:////from/variable.db")
