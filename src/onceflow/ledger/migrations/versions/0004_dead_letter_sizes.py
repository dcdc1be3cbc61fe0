"""Dead letters keep a prefix of a record's key and value, and their whole sizes.

A flood of large poison records must not fill a Spark driver or the ledger: a letter keeps at most a
prefix of each, and these columns say how large the record was. Letters written before keep their bytes
whole, with no sizes.

Revision ID: 0004_dead_letter_sizes
Revises: 0003_drop_state_snapshots
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_dead_letter_sizes"
down_revision: str | None = "0003_drop_state_snapshots"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("dead_letters") as batch:
        batch.add_column(sa.Column("key_size", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("value_size", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dead_letters") as batch:
        batch.drop_column("value_size")
        batch.drop_column("key_size")
