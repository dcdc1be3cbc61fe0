"""What crosses the executor boundary: a task attempt's identity and the committable it hands back.

Neutral ground shared by the executor package (which builds them), the ledger (which stores them) and
the coordinator's committers (which commit them), so that none of those has to import another. Like
Flink's committables, a `Committable` is small, serializable and versioned: ``format`` is the envelope's
version, ``version`` the sink kind's handle format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from onceflow.errors import ConfigError
from onceflow.offsets import OffsetRange

FORMAT = 1


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
    version: int = 1  # the format of ``handle``, owned by the sink kind (`SinkKind.committable_version`)

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
        """The serialized committable the ledger stores (``format`` is this envelope's own version)."""
        return json.dumps(
            {
                "format": FORMAT,
                "version": self.version,
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
        if int(data.get("format", FORMAT)) > FORMAT:
            raise ConfigError(
                f"a committable of format {data['format']} was written by a newer onceflow (this one reads "
                f"format {FORMAT}): upgrade onceflow before committing or aborting its epoch"
            )
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
            version=int(data.get("version", 1)),
        )
