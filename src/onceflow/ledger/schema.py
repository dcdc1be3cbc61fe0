"""Connecting to the ledger database and keeping its schema at the revision this code expects.

SQLite is opened in WAL mode with a busy timeout and every transaction starts with ``BEGIN IMMEDIATE``:
several processes (DAG tasks, Spark executors, the CLI) share one file, and taking the write lock up front
makes them queue instead of failing when a read transaction later tries to write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from onceflow import redact
from onceflow.errors import ConfigError, one_line
from onceflow.ledger.errors import LedgerUnavailable, SchemaMismatch

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000


def normalize_url(url: str) -> URL:
    """Parse a ledger URL; plain ``postgresql://`` (or ``postgres://``) means the psycopg 3 driver."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise ConfigError(
            f"ONCEFLOW_LEDGER_URL={redact.url(url)!r}: not an SQLAlchemy URL ({redact.text(exc)})"
        ) from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise ConfigError(
            f"ONCEFLOW_LEDGER_URL={redact.url(url)!r}: the ledger runs on sqlite or postgresql, not {backend}"
        )
    return parsed


def make_engine(url: str) -> Engine:
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "postgresql":
        return create_engine(parsed, pool_pre_ping=True)
    if parsed.database and parsed.database != ":memory:":
        folder = Path(parsed.database).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerUnavailable(
                f"cannot create the folder {folder} of the SQLite ledger {parsed.database} ({exc.strerror}): "
                "check ONCEFLOW_LEDGER_URL (or ONCEFLOW_HOME, where the default ledger lives)"
            ) from exc
    engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself, instead of pysqlite's deferred BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def shown_url(engine: Engine) -> str:
    """The ledger's URL as a message may show it: SQLAlchemy's own hiding leaves a ``?password=`` and
    the tail of a password with a raw ``@`` in sight, `redact.url` hides them too."""
    return redact.url(engine.url.render_as_string(hide_password=False))


def probe(engine: Engine) -> None:
    """Open one connection now, so that an unreachable or missing database is one clear line here and
    not a driver traceback from the first query."""
    try:
        with engine.connect():
            pass
    except DBAPIError as exc:
        where = shown_url(engine)
        raise LedgerUnavailable(
            f"cannot open the ledger at {where} ({redact.text(one_line(exc.orig))}): check "
            "ONCEFLOW_LEDGER_URL (or --ledger-url, or the onceflow_ledger connection) and that its "
            "database server is running and the database exists"
        ) from exc


def _alembic_config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None, "the ledger ships at least one migration"
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def check_schema(engine: Engine) -> None:
    """Raise `SchemaMismatch` unless the database is at exactly the revision this code expects."""
    where = shown_url(engine)
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return
    if current is None:
        raise SchemaMismatch(f"the ledger at {where} is not initialised, run `onceflow db upgrade`")
    known = {script.revision for script in ScriptDirectory(str(MIGRATIONS)).walk_revisions()}
    if current in known:
        raise SchemaMismatch(
            f"the ledger at {where} is at schema revision {current!r}, older than {head!r}: "
            "run `onceflow db upgrade`"
        )
    raise SchemaMismatch(
        f"the ledger at {where} is at schema revision {current!r}, which this onceflow does not know "
        f"(it expects {head!r}): it was made by a newer onceflow; upgrade onceflow, then run "
        "`onceflow db upgrade`"
    )


def upgrade(engine: Engine) -> None:
    """Bring the schema to head (alembic upgrade head); a no-op when it is there already."""
    with engine.begin() as conn:
        try:
            command.upgrade(_alembic_config(conn), "head")
        except CommandError as exc:
            raise SchemaMismatch(
                f"cannot upgrade the ledger at {shown_url(engine)}: "
                f"{redact.text(exc)} (was it made by a newer onceflow?)"
            ) from exc
