"""The ledger: the store of the protocol's durable state, with compare-and-set transitions.

Open it with ``Ledger.connect(url)`` (URL from ``Settings.ledger_url``). It imports nothing of the
coordinator, the committers or any sink: `onceflow.protocol.coordinator` drives the protocol through it.
"""

from onceflow.decoding.records import DeadLetter
from onceflow.ledger.errors import (
    EpochInFlight,
    EpochNotPlanned,
    IllegalTransition,
    InvalidPlan,
    LedgerError,
    LedgerUnavailable,
    MissingCommitter,
    OffsetGap,
    ParticipantsMissing,
    PrecommitRefused,
    Refused,
    SchemaMismatch,
    SinkCallFailed,
    SinkCallFailedKnown,
    SinkCallRetryLater,
    StaleAttemptToken,
    UnexpectedParticipant,
    UnknownEpoch,
)
from onceflow.ledger.ledger import Ledger, Registration
from onceflow.ledger.models import EpochStatus, ParticipantStatus
from onceflow.ledger.records import Epoch, Participant, StoredDeadLetter

__all__ = [
    "DeadLetter",
    "Epoch",
    "EpochInFlight",
    "EpochNotPlanned",
    "EpochStatus",
    "IllegalTransition",
    "InvalidPlan",
    "Ledger",
    "LedgerError",
    "LedgerUnavailable",
    "MissingCommitter",
    "OffsetGap",
    "Participant",
    "ParticipantStatus",
    "ParticipantsMissing",
    "PrecommitRefused",
    "Refused",
    "Registration",
    "SchemaMismatch",
    "SinkCallFailed",
    "SinkCallFailedKnown",
    "SinkCallRetryLater",
    "StaleAttemptToken",
    "StoredDeadLetter",
    "UnexpectedParticipant",
    "UnknownEpoch",
]
