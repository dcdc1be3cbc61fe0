"""Errors raised by the sinks: each names the pipeline, epoch, sink and task it is about."""

from __future__ import annotations

from onceflow.errors import OnceflowError


class SinkError(OnceflowError):
    """Base of the sinks' errors."""


class RowError(SinkError):
    """A row does not fit the sink (a missing or unknown column, a value of the wrong type).

    Raised instead of dropping or guessing, because a silently lost column is lost data.
    """


class WriterStateError(SinkError):
    """A writer method was called out of order (e.g. ``write`` before ``begin``)."""


class RetryLater(SinkError):
    """A committer cannot do its call now but expects to soon (its service is restarting, a lock is
    held): the coordinator calls again after a pause, then leaves the epoch as it is for the next step.
    Flink's ``CommitRequest.retryLater``."""


class KnownFailure(SinkError):
    """A committer call failed for a reason it knows and that no retry mends (staged output lost or
    corrupt, output already visible): the step fails at once with one line for a human. Flink's
    ``CommitRequest.signalFailedWithKnownReason``."""


class StagedOutputLost(KnownFailure):
    """Commit found neither the staged output nor any evidence that it was already committed.

    This must never be accepted silently: the epoch's output would be lost while its offsets advance.
    """


class StagedOutputCorrupt(KnownFailure):
    """The staged output does not match the checksum recorded at pre-commit."""


class UnsafePath(KnownFailure):
    """A name read back from a committable or a commit log would lead outside its folder (``..``, an
    absolute path, a separator where one name belongs): refused, never joined into a path."""


class AlreadyCommitted(KnownFailure):
    """Abort was asked for output that is already committed (and therefore visible downstream)."""


class ConflictingAttempt(KnownFailure):
    """Another attempt of the same task holds or has committed the task's output."""
