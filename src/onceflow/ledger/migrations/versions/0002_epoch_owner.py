"""Epoch ownership (owner, lease) and an index to find a run's epoch without scanning every epoch.

Revision ID: 0002_epoch_owner
Revises: 0001_initial
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_epoch_owner"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("epochs") as batch:
        batch.add_column(sa.Column("owner", sa.Text(), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_epochs_run", "epochs", ["pipeline", "run_id"])


def downgrade() -> None:
    op.drop_index("ix_epochs_run", table_name="epochs")
    with op.batch_alter_table("epochs") as batch:
        batch.drop_column("lease_expires_at")
        batch.drop_column("owner")
