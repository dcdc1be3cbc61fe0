"""The two-phase sink interface.

A sink is split in two, as in Flink's Sink V2:

* a `SinkWriter` runs inside a Spark task: ``begin(task) -> write(rows)* -> pre_commit()`` stages the
  task's output durably without making it visible and returns a `Committable`, a small JSON handle that
  the task reports to the ledger;
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

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from onceflow.offsets import OffsetRange

Row = Mapping[str, Any]


@dataclass(frozen=True)
class TaskContext:
    """Identifies one attempt of one parallel task of one epoch.

    ``task`` is stable across retries of the same piece of work (e.g. ``"s0-t3"`` for slice 0, task 3);
    ``attempt`` differs for each retry or speculative copy, so that the ledger can accept exactly one
    attempt per task. A slice owns its input partitions; ``inputs`` are the offset ranges whose records
    produced this task's output (all of the slice's ranges when the task follows a shuffle).
    """

    pipeline: str
    epoch: int
    slice: int
    task: str
    attempt: str
    sink: str
    inputs: tuple[OffsetRange, ...] = ()
    replaces: tuple[int, ...] = ()

    @property
    def txn_id(self) -> str:
        """A deterministic transaction id, unique per (pipeline, epoch, sink, task, attempt)."""
        return f"of:{self.pipeline}:{self.epoch}:{self.sink}:{self.task}:{self.attempt}"


@dataclass(frozen=True)
class Committable:
    """What a writer hands to the coordinator: enough to commit or abort the staged output later."""

    pipeline: str
    epoch: int
    slice: int
    task: str
    attempt: str
    sink: str
    inputs: tuple[OffsetRange, ...] = ()
    replaces: tuple[int, ...] = ()
    handle: Mapping[str, Any] = field(default_factory=dict)
    record_count: int = 0
    checksum: str = ""

    @classmethod
    def for_task(cls, task: TaskContext, **fields: Any) -> Committable:
        return cls(
            pipeline=task.pipeline,
            epoch=task.epoch,
            slice=task.slice,
            task=task.task,
            attempt=task.attempt,
            sink=task.sink,
            inputs=task.inputs,
            replaces=task.replaces,
            **fields,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "pipeline": self.pipeline,
                "epoch": self.epoch,
                "slice": self.slice,
                "task": self.task,
                "attempt": self.attempt,
                "sink": self.sink,
                "inputs": [[r.topic, r.partition, r.from_offset, r.until_offset] for r in self.inputs],
                "replaces": list(self.replaces),
                "handle": dict(self.handle),
                "record_count": self.record_count,
                "checksum": self.checksum,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Committable:
        data = json.loads(text)
        return cls(
            pipeline=data["pipeline"],
            epoch=int(data["epoch"]),
            slice=int(data["slice"]),
            task=data["task"],
            attempt=data["attempt"],
            sink=data["sink"],
            inputs=tuple(OffsetRange(t, int(p), int(a), int(b)) for t, p, a, b in data.get("inputs", [])),
            replaces=tuple(int(n) for n in data.get("replaces", [])),
            handle=data.get("handle", {}),
            record_count=int(data.get("record_count", 0)),
            checksum=data.get("checksum", ""),
        )


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
