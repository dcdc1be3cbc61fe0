"""The two-phase sink interface.

A sink is split in two, as in Flink's Sink V2:

* a `SinkWriter` runs inside a Spark task: ``begin(task) -> write(rows)* -> pre_commit()`` stages the
  task's output durably without making it visible and returns a `Committable`, a small JSON handle that
  the task reports to the ledger. A writer that also has ``write_batch(batch)`` (`BatchSinkWriter`)
  takes the Arrow record batches a Spark task receives as they are, with no Python object per value;
  for any other writer the task turns each batch into rows once (`supports_batches`);
* a `SinkCommitter` runs in the coordinator, in another process, possibly much later and possibly
  several times: ``commit(cs)`` makes the staged output of an epoch's committables visible and
  ``abort(cs)`` discards it. Both take all of one epoch's committables for the sink at once (as Flink's
  ``Committer.commit(Collection)``), so that a sink may group them, e.g. one Kafka transaction per slice.
  Both must be idempotent, because a crash can interrupt them at any point and recovery simply calls them
  again.
  ``orphans(pipeline)`` lists what is staged in the sink, so that the sweeper can roll back whatever the
  ledger does not own.

Executors import writers only and the coordinator committers only, so neither drags in the other's
dependencies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from onceflow.committables import Committable, TaskContext

if TYPE_CHECKING:
    import pyarrow as pa

Row = Mapping[str, Any]
__all__ = [
    "BatchSinkWriter",
    "Committable",
    "Row",
    "SinkCommitter",
    "SinkWriter",
    "TaskContext",
    "supports_batches",
]


class SinkWriter(Protocol):
    """Runs in a Spark task. One instance per task attempt."""

    def begin(self, task: TaskContext) -> None: ...

    def write(self, rows: Iterable[Row]) -> None: ...

    def pre_commit(self) -> Committable:
        """Make the staged output durable (but invisible) and describe it."""
        ...

    def abort(self) -> None:
        """Discard this attempt's staged output (e.g. the ledger refused the pre-commit)."""
        ...


class BatchSinkWriter(SinkWriter, Protocol):
    """A writer that also stages Arrow record batches directly, the hot path of a Spark write task.

    ``write_batch`` must stage exactly what ``write(batch.to_pylist())`` would: the same rows, the same
    staged format, the same errors for rows the sink refuses. Calls of both may be mixed; order is kept.
    """

    def write_batch(self, batch: pa.RecordBatch) -> None: ...


def supports_batches(writer: SinkWriter) -> TypeGuard[BatchSinkWriter]:
    """Whether ``writer`` takes Arrow batches; other writers (e.g. a user's own kind) get rows."""
    return callable(getattr(writer, "write_batch", None))


class SinkCommitter(Protocol):
    """Runs in the coordinator. Every method is idempotent and may be called any number of times."""

    def commit(self, committables: Sequence[Committable]) -> None:
        """Make these staged outputs visible; committing twice has the effect of committing once."""
        ...

    def abort(self, committables: Sequence[Committable]) -> None:
        """Discard these staged outputs; never touches output that is already committed."""
        ...

    def orphans(self, pipeline: str) -> list[Committable]:
        """Everything staged or prepared in the sink for this pipeline that is not yet committed."""
        ...
