"""An orders example stack per test: fresh topics, database, ledger and staging, exported to Airflow."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from onceflow.ledger import Ledger


@dataclass
class OrdersStack:
    env: dict[str, str]
    pipeline: str
    topic: str
    enriched: str
    dsn: str
    ledger_url: str
    orders_table: str
    rejected_table: str

    def pg_rows(self, sql: str) -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return list(conn.execute(sql).fetchall())

    def order_ids(self) -> list[int]:
        return [int(r[0]) for r in self.pg_rows(f"SELECT order_id FROM {self.orders_table} ORDER BY 1")]  # type: ignore[call-overload]

    def set_database_online(self, settings_dsn: str, online: bool) -> None:
        """A sink outage: the sinks' database refuses every new connection until it is back."""
        import psycopg

        name = self.dsn.rpartition("/")[2]
        with psycopg.connect(settings_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if online else "false"}')


def _rollback(dsn: str, gid: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ROLLBACK PREPARED '{gid}'")


@pytest.fixture
def orders_stack(
    airflow_env, settings, make_topic, kafka_admin, pg_database, tmp_path: Path
) -> Iterator[OrdersStack]:
    from confluent_kafka.admin import NewTopic

    topic = make_topic("orders", partitions=1)
    suffix = topic.removeprefix("orders")
    enriched = f"orders-enriched{suffix}"
    kafka_admin.create_topics([NewTopic(enriched, num_partitions=1, replication_factor=1)])[enriched].result(
        30
    )
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger.connect(ledger_url, check=False) as ledger:
        ledger.upgrade()
    env = {
        **airflow_env,
        "ONCEFLOW_ORDERS_SUFFIX": suffix,
        "ONCEFLOW_ORDERS_PG_DSN": pg_database,
        "ONCEFLOW_LEDGER_URL": ledger_url,
        "ONCEFLOW_HOME": str(tmp_path / "home"),
    }
    stack = OrdersStack(
        env=env,
        pipeline=f"orders{suffix}",
        topic=topic,
        enriched=enriched,
        dsn=pg_database,
        ledger_url=ledger_url,
        orders_table=f"orders{suffix}".replace("-", "_"),
        rejected_table=f"orders_rejected{suffix}".replace("-", "_"),
    )
    yield stack
    with contextlib.suppress(Exception):
        stack.set_database_online(settings.pg_dsn, True)
    # A test that stopped half-way may leave prepared transactions, which keep the database from dropping.
    for (gid,) in stack.pg_rows("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"):
        _rollback(stack.dsn, str(gid))
    for future in kafka_admin.delete_topics([enriched]).values():
        with contextlib.suppress(Exception):
            future.result(30)
