"""The ledger: the coordinator's durable epoch state machine, recovery and the orphan sweeper.

Everything goes through `Ledger` (``Ledger.connect(url)``, URL from ``Settings.ledger_url``); see
`ledger.Ledger` for the state machine and `coordinator` for commit, abort and recovery.
"""

from onceflow.ledger.committers import (
    CommitterProvider,
    committer_provider,
    committers_for,
    set_committer_provider,
)
from onceflow.ledger.coordinator import RecoveryReport, classify_orphan
from onceflow.ledger.errors import (
    EpochInFlight,
    EpochNotPlanned,
    IllegalTransition,
    InvalidPlan,
    LedgerError,
    LosingAttempt,
    MissingCommitter,
    OffsetGap,
    ParticipantsMissing,
    PrecommitRefused,
    SchemaMismatch,
    SinkCallFailed,
    StaleAttemptToken,
    UnexpectedParticipant,
    UnknownEpoch,
)
from onceflow.ledger.ledger import Ledger
from onceflow.ledger.models import EpochStatus, ParticipantStatus, SnapshotStatus
from onceflow.ledger.records import Epoch, Participant, StateSnapshot, StoredDeadLetter
from onceflow.records import DeadLetter

__all__ = [
    "CommitterProvider",
    "DeadLetter",
    "Epoch",
    "EpochInFlight",
    "EpochNotPlanned",
    "EpochStatus",
    "IllegalTransition",
    "InvalidPlan",
    "Ledger",
    "LedgerError",
    "LosingAttempt",
    "MissingCommitter",
    "OffsetGap",
    "Participant",
    "ParticipantStatus",
    "ParticipantsMissing",
    "PrecommitRefused",
    "RecoveryReport",
    "SchemaMismatch",
    "SinkCallFailed",
    "SnapshotStatus",
    "StaleAttemptToken",
    "StateSnapshot",
    "StoredDeadLetter",
    "UnexpectedParticipant",
    "UnknownEpoch",
    "classify_orphan",
    "committer_provider",
    "committers_for",
    "set_committer_provider",
]
