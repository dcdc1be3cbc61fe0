"""Alembic environment of the ledger, run programmatically by `onceflow.ledger.schema.upgrade`.

There is no alembic.ini: the caller passes an open connection in ``config.attributes["connection"]``, so
migrations run inside the caller's transaction (and, on SQLite, under its write lock).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from onceflow.ledger.models import Base

connection = context.config.attributes.get("connection")
if not isinstance(connection, Connection):
    raise RuntimeError("the ledger migrations run through onceflow.ledger.schema.upgrade (no alembic.ini)")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
