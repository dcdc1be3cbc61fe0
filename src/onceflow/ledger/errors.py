"""Typed errors of the ledger: each message names the pipeline, the epoch and why the ledger said no.

Callers branch on the class (a DAG task turns `IllegalTransition` into a clear refusal, a Spark task turns
`PrecommitRefused` into rolling back its own staging), so every refusal the invariants demand has one.
"""

from __future__ import annotations

from onceflow.errors import OnceflowError, ServiceUnavailable


class LedgerError(OnceflowError):
    """Base of every error the ledger raises on purpose."""


class LedgerUnavailable(LedgerError, ServiceUnavailable):
    """The ledger's database could not be opened: server down, database missing, bad credentials."""


class SchemaMismatch(LedgerError):
    """The ledger database was made by another schema revision (or not initialised at all)."""


class UnknownEpoch(LedgerError):
    """The pipeline has no epoch with that number."""


class InvalidPlan(LedgerError):
    """A plan is malformed: duplicate partitions, duplicate participants, a bad data interval."""


class EpochInFlight(InvalidPlan):
    """Invariant 1: another epoch of the pipeline is not final yet."""


class OffsetGap(InvalidPlan):
    """Invariant 2: a range does not start where the last committed epoch ended."""


class PrecommitRefused(LedgerError):
    """Invariant 3: the ledger did not accept a pre-commit; the caller must abort its own staging."""


class EpochNotPlanned(PrecommitRefused):
    """The epoch has already been decided or aborted."""


class StaleAttemptToken(PrecommitRefused):
    """The attempt token is not the epoch's current one (a zombie from a superseded attempt)."""


class UnexpectedParticipant(PrecommitRefused):
    """The (sink, task) was not planned as a participant of the epoch."""


class IllegalTransition(LedgerError):
    """The epoch's current status does not allow the requested transition."""


class Refused(IllegalTransition):
    """The invariants forbid what was asked (commit of an aborted epoch, abort of a decided one);
    nothing was changed. The message is the same whichever door asked (`onceflow.ledger.refusals`)."""


class ParticipantsMissing(IllegalTransition):
    """Invariant 4: the decision to commit needs every expected participant PRECOMMITTED."""


class MissingCommitter(LedgerError):
    """A sink of the epoch has no committer, so the coordinator cannot commit or abort it."""


class SinkCallFailed(LedgerError):
    """A committer's commit or abort raised; the epoch stays as it is and the call is retried later."""


class SinkCallRetryLater(SinkCallFailed):
    """The committer asked to be called later, and still did after the coordinator's pauses; the next
    commit, abort or recover calls it again."""


class SinkCallFailedKnown(SinkCallFailed):
    """The committer failed for a reason it knows and no retry mends; a retried task would fail the
    same way, so the doors fail without retrying and show the line to a human."""
