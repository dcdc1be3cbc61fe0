"""What the Debezium pipeline tests share: the captured source table read back row for row, the changes
they make to it for their second epoch, and dropping the connector's topic afterwards."""

from __future__ import annotations

from typing import Any

import psycopg

SOURCE_COLUMNS = ("id", "name", "qty", "price", "updated_at")
# The change events `change_in_second_epoch` makes Debezium emit: an insert, four updates, a delete and its
# tombstone, and the transaction's insert and update.
SECOND_EPOCH_EVENTS = 9


def table_rows(dsn: str, table: str) -> dict[int, dict[str, Any]]:
    """The rows of a table with the source table's columns (the source or its mirror) by id."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(f"SELECT {', '.join(SOURCE_COLUMNS)} FROM {table}").fetchall()
    return {r[0]: dict(zip(SOURCE_COLUMNS, r, strict=True)) for r in rows}


def change_in_second_epoch(dsn: str, table: str) -> None:
    """An insert (key 3); key 1 updated four times, so that its changes fall into several read tasks of
    the epoch; a delete (key 2); and a transaction inserting key 4 and updating it. After the snapshot of
    keys 1 and 2 the table holds keys 1, 3 and 4."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {table} (id, name, qty, price) VALUES (3, 'eve', 7, 0.99)")
        for qty in (4, 5, 6, 7):
            conn.execute(f"UPDATE {table} SET qty = {qty}, price = 10.25, updated_at = now() WHERE id = 1")
        conn.execute(f"DELETE FROM {table} WHERE id = 2")
        with conn.transaction():
            conn.execute(f"INSERT INTO {table} (id, name, qty) VALUES (4, 'kim', NULL)")
            conn.execute(f"UPDATE {table} SET name = 'kim k', price = 1234567.89 WHERE id = 4")


def delete_topic(kafka_admin: Any, topic: str) -> None:
    """Drop ``topic`` if it exists (a connector's topic outlives the connector)."""
    if topic in set(kafka_admin.list_topics(timeout=10).topics):
        for future in kafka_admin.delete_topics([topic]).values():
            future.result(timeout=30)
