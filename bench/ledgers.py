"""Fresh ledgers for a benchmark run: an SQLite file, or a new database on the stack's PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from onceflow.ledger import Ledger


@contextmanager
def sqlite_ledger(workdir: Path) -> Iterator[str]:
    url = f"sqlite:///{workdir / f'ledger-{uuid.uuid4().hex[:8]}.db'}"
    _upgrade(url)
    yield url


@contextmanager
def postgres_ledger(pg_dsn: str) -> Iterator[str]:
    """A new database on ONCEFLOW_PG_DSN's server, dropped afterwards."""
    name = f"bench_ledger_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"postgresql+psycopg://{pg_dsn.split('://', 1)[1].rpartition('/')[0]}/{name}"
        _upgrade(url)
        yield url
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _upgrade(url: str) -> None:
    ledger = Ledger.connect(url, check=False)
    try:
        ledger.upgrade()
    finally:
        ledger.close()
