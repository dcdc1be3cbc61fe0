"""The odd/even running sums example through Airflow: keyed state carried from one DAG run to the next."""

from __future__ import annotations

import json

import psycopg
import pytest
from examples.orders.data import produce

from onceflow.ledger import EpochStatus, Ledger
from tests.integration.airflow.helpers import dags_test

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_running_sums_over_two_dag_runs(airflow_env, make_topic, tmp_path, settings) -> None:
    topic = make_topic("numbers", partitions=2)
    suffix = topic.removeprefix("numbers")
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger.connect(ledger_url, check=False) as ledger:
        ledger.upgrade()
    env = {
        **airflow_env,
        "ONCEFLOW_ODD_EVEN_SUFFIX": suffix,
        "ONCEFLOW_LEDGER_URL": ledger_url,
        "ONCEFLOW_HOME": str(tmp_path / "home"),
    }
    table = "parity_sums" + suffix.replace("-", "_")
    try:
        for numbers in (range(1, 21), range(21, 31)):
            produce(settings.kafka_bootstrap, topic, [(None, json.dumps({"n": n}).encode()) for n in numbers])
            print(dags_test(env, "onceflow_odd_even")[-6000:])  # shown by pytest when the test fails
        with Ledger.connect(ledger_url) as ledger:
            assert [e.status for e in ledger.epochs(f"odd-even{suffix}")] == [EpochStatus.COMMITTED] * 2
        with psycopg.connect(settings.pg_dsn) as conn:
            sums = dict(conn.execute(f"SELECT parity, total FROM {table}").fetchall())
        assert sums == {"odd": sum(range(1, 31, 2)), "even": sum(range(2, 31, 2))}
    finally:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
