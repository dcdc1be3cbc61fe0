"""The ledger's first schema: pipelines, epochs, offsets, participants, state snapshots, dead letters.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OPEN = "status IN ('PLANNED', 'COMMITTING', 'ABORTING')"


def _epoch_type() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    ts = sa.DateTime(timezone=True)
    op.create_table(
        "pipelines",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("created_at", ts, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_pipelines"),
    )
    op.create_table(
        "epochs",
        sa.Column("pipeline", sa.String(100), nullable=False),
        sa.Column("epoch", _epoch_type(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=True),
        sa.Column("attempt_token", sa.String(64), nullable=False),
        sa.Column("data_interval_start", ts, nullable=True),
        sa.Column("data_interval_end", ts, nullable=True),
        sa.Column("expected_participants", sa.Text(), nullable=False),
        sa.Column("planned_at", ts, nullable=False),
        sa.Column("decided_at", ts, nullable=True),
        sa.Column("finished_at", ts, nullable=True),
        sa.Column("abort_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("pipeline", "epoch", name="pk_epochs"),
        sa.ForeignKeyConstraint(["pipeline"], ["pipelines.name"], name="fk_epochs_pipelines"),
    )
    op.create_index(
        "uq_epochs_one_open_per_pipeline",
        "epochs",
        ["pipeline"],
        unique=True,
        sqlite_where=sa.text(_OPEN),
        postgresql_where=sa.text(_OPEN),
    )
    op.create_index("ix_epochs_interval", "epochs", ["pipeline", "data_interval_start", "data_interval_end"])
    op.create_table(
        "epoch_offsets",
        sa.Column("pipeline", sa.String(100), nullable=False),
        sa.Column("epoch", _epoch_type(), nullable=False),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("from_offset", sa.BigInteger(), nullable=False),
        sa.Column("until_offset", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("pipeline", "epoch", "topic", "partition", name="pk_epoch_offsets"),
        sa.ForeignKeyConstraint(
            ["pipeline", "epoch"], ["epochs.pipeline", "epochs.epoch"], name="fk_epoch_offsets_epochs"
        ),
    )
    op.create_table(
        "participants",
        sa.Column("pipeline", sa.String(100), nullable=False),
        sa.Column("epoch", _epoch_type(), nullable=False),
        sa.Column("sink", sa.String(100), nullable=False),
        sa.Column("task", sa.String(100), nullable=False),
        sa.Column("slice", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.String(100), nullable=False),
        sa.Column("attempt_token", sa.String(64), nullable=False),
        sa.Column("committable", sa.Text(), nullable=False),
        sa.Column("staged_location", sa.Text(), nullable=True),
        sa.Column("record_count", sa.BigInteger(), nullable=False),
        sa.Column("checksum", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("precommitted_at", ts, nullable=False),
        sa.Column("finished_at", ts, nullable=True),
        sa.PrimaryKeyConstraint("pipeline", "epoch", "sink", "task", name="pk_participants"),
        sa.ForeignKeyConstraint(
            ["pipeline", "epoch"], ["epochs.pipeline", "epochs.epoch"], name="fk_participants_epochs"
        ),
    )
    op.create_table(
        "state_snapshots",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("pipeline", sa.String(100), nullable=False),
        sa.Column("epoch", _epoch_type(), nullable=False),
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
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("pipeline", sa.String(100), nullable=False),
        sa.Column("epoch", _epoch_type(), nullable=False),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.LargeBinary(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", ts, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_dead_letters"),
        sa.ForeignKeyConstraint(
            ["pipeline", "epoch"], ["epochs.pipeline", "epochs.epoch"], name="fk_dead_letters_epochs"
        ),
    )
    op.create_index(
        "uq_dead_letters_record",
        "dead_letters",
        ["pipeline", "epoch", "topic", "partition", "offset"],
        unique=True,
    )


def downgrade() -> None:
    for table in ("dead_letters", "state_snapshots", "participants", "epoch_offsets", "epochs", "pipelines"):
        op.drop_table(table)
