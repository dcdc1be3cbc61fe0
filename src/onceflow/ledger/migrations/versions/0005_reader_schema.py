"""Pipelines remember the reader schema their last planned epoch read with.

The plan step compares a pipeline's reader schema with the one its earlier epochs read: new nullable
fields are taken (the sinks add the columns), and a field gone, narrowed or changed is refused before the
epoch is planned. Pipelines planned before this revision have none yet; their next plan records it.

Revision ID: 0005_reader_schema
Revises: 0004_dead_letter_sizes
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_reader_schema"
down_revision: str | None = "0004_dead_letter_sizes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE on both databases (SQLite has had DROP COLUMN since 3.35): a batch operation would
# copy the pipelines table, which every epoch row references.


def upgrade() -> None:
    op.add_column("pipelines", sa.Column("reader_schema", sa.Text(), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE pipelines DROP COLUMN reader_schema")
