"""Test data for the engine tests: records produced transactionally, and what the sinks hold."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Producer

ORDERS = "tests.integration.engine.pipelines:ORDERS"


def produce(
    bootstrap: str, topic: str, orders: list[dict], *, abort: list[dict] = (), bad: list[bytes] = ()
) -> None:
    """Commit ``orders`` (keyed by id) and ``bad`` raw values in one transaction; then abort ``abort``."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)
    producer.begin_transaction()
    for order in orders:
        producer.produce(topic, key=str(order.get("id", "")).encode(), value=json.dumps(order).encode())
    for raw in bad:
        producer.produce(topic, key=b"bad", value=raw)
    producer.commit_transaction(30)
    if abort:
        producer.begin_transaction()
        for order in abort:
            producer.produce(topic, key=str(order.get("id", "")).encode(), value=json.dumps(order).encode())
        producer.flush(30)
        producer.abort_transaction(30)


def orders(start: int, count: int) -> list[dict]:
    return [{"id": i, "amount": float(i % 5), "customer": f"c{i % 3}"} for i in range(start, start + count)]


def pg_ids(pg_connect, table: str) -> list[int]:  # type: ignore[no-untyped-def]
    rows = pg_connect(autocommit=True).execute(f"SELECT id FROM {table} ORDER BY id").fetchall()
    return [r[0] for r in rows]


def prepared_count(pg_connect, pipeline: str) -> int:  # type: ignore[no-untyped-def]
    """Prepared transactions the pipeline's PostgreSQL sinks left in the database."""
    row = (
        pg_connect(autocommit=True)
        .execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"onceflow:{pipeline}%",))
        .fetchone()
    )
    return int(row[0])


def delivered_ids(pg_connect, stack) -> tuple[list[int], list[int]]:  # type: ignore[no-untyped-def]
    """The order ids the orders pipeline committed: in its PostgreSQL table and its files, each sorted."""
    from onceflow.sinks.files import read_committed_table

    files = read_committed_table(stack["ONCEFLOW_TEST_FILES"], "orders")
    return pg_ids(pg_connect, stack["ONCEFLOW_TEST_TABLE"]), sorted(files.column("id").to_pylist())


def dead_letter_codes(stack) -> list[str]:  # type: ignore[no-untyped-def]
    """The reason codes of the pipeline's committed dead letters, sorted."""
    from onceflow.ledger import Ledger

    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        letters = ledger.dead_letters(stack["ONCEFLOW_TEST_PIPELINE"])
    return sorted(d.letter.reason.split(":")[0] for d in letters)


def wait_while_running(
    condition: Callable[[], bool], what: str, process: subprocess.Popen[str], timeout: float = 120
) -> None:
    """Until ``condition()`` holds; fails at once, with the process's output, if ``process`` exits first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"{what}: the process exited {process.returncode}: {process.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.1)
