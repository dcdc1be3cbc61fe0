"""PostgreSQL prepared transactions survive their session and are finished from another connection."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def table(pg_connect):
    name = f"smoke_2pc_{uuid.uuid4().hex[:8]}"
    admin = pg_connect(autocommit=True)
    admin.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
    yield name
    admin.execute(f"DROP TABLE IF EXISTS {name}")


def _prepare(pg_connect, table: str, gid: str, rows: list[tuple[int, str]]) -> None:
    """Write rows in a transaction, PREPARE it, and close the connection that did it."""
    writer = pg_connect()
    with writer.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} (id, v) VALUES (%s, %s)", rows)
        # PREPARE TRANSACTION takes a literal, not a bind parameter.
        cur.execute(f"PREPARE TRANSACTION '{gid}'")
    writer.close()


def _visible(pg_connect, table: str) -> list[tuple[int, str]]:
    reader = pg_connect(autocommit=True)
    return reader.execute(f"SELECT id, v FROM {table} ORDER BY id").fetchall()


def _prepared_gids(pg_connect) -> set[str]:
    reader = pg_connect(autocommit=True)
    return {row[0] for row in reader.execute("SELECT gid FROM pg_prepared_xacts").fetchall()}


def test_max_prepared_transactions_is_enabled(pg_connect) -> None:
    value = pg_connect(autocommit=True).execute("SHOW max_prepared_transactions").fetchone()[0]
    assert int(value) >= 64


def test_commit_prepared_from_another_connection(pg_connect, table) -> None:
    gid = f"smoke-{uuid.uuid4().hex}"
    _prepare(pg_connect, table, gid, [(1, "a"), (2, "b")])
    assert _visible(pg_connect, table) == []  # prepared, not visible
    assert gid in _prepared_gids(pg_connect)  # and it outlived the connection that prepared it

    pg_connect(autocommit=True).execute(f"COMMIT PREPARED '{gid}'")
    assert _visible(pg_connect, table) == [(1, "a"), (2, "b")]
    assert gid not in _prepared_gids(pg_connect)


def test_rollback_prepared_from_another_connection(pg_connect, table) -> None:
    gid = f"smoke-{uuid.uuid4().hex}"
    _prepare(pg_connect, table, gid, [(1, "a")])
    pg_connect(autocommit=True).execute(f"ROLLBACK PREPARED '{gid}'")
    assert _visible(pg_connect, table) == []
    assert gid not in _prepared_gids(pg_connect)
