"""Drop ``state_snapshots``: keyed state is a files participant of its epoch, not a ledger row.

A stateful pipeline's snapshot is staged, committed, discarded and swept as the output of the internal
state sink (`onceflow.state.store`), so the protocol never wrote this table; its rows, if any, name
nothing a step reads. The downgrade recreates it empty, as revision 0001 made it.

Revision ID: 0003_drop_state_snapshots
Revises: 0002_epoch_owner
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_drop_state_snapshots"
down_revision: str | None = "0002_epoch_owner"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_state_snapshots_pipeline", table_name="state_snapshots")
    op.drop_table("state_snapshots")


def downgrade() -> None:
    ts = sa.DateTime(timezone=True)
    op.create_table(
        "state_snapshots",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("pipeline", sa.String(100), nullable=False),
        sa.Column("epoch", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("location", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", ts, nullable=False),
        sa.Column("updated_at", ts, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_state_snapshots"),
        sa.ForeignKeyConstraint(
            ["pipeline", "epoch"], ["epochs.pipeline", "epochs.epoch"], name="fk_state_snapshots_epochs"
        ),
    )
    op.create_index("ix_state_snapshots_pipeline", "state_snapshots", ["pipeline"])
