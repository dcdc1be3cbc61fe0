"""What the protocol's steps return, in forms an Airflow XCom, ``--json`` and the console can carry.

The coordinator returns these objects; the doors (operators, CLI, runner, console) read their fields,
never the text of their lines, to decide what to do next.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from onceflow.committables import Committable
from onceflow.ledger import Epoch

PlanStatus = Literal["planned", "preview", "already_committed"]
RecoveryOutcome = Literal["nothing in flight", "committed", "aborted", "kept"]
# What a process task does with its slice: run it, skip it (nothing to do), or fail (the epoch was
# aborted under it: the run cannot commit, and the next run replays the range).
SliceVerdict = Literal["process", "skip", "aborted"]


@dataclass(frozen=True)
class PlanResult:
    """What ``plan`` decided, small enough for an Airflow XCom (see `to_dict`)."""

    status: PlanStatus
    pipeline: str
    epoch: int | None = None
    attempt_token: str | None = None
    slices_with_tasks: tuple[int, ...] = ()
    lines: tuple[str, ...] = field(default=())
    span: int = 0  # offsets the epoch reads
    backlog: int = 0  # offsets left for later epochs when it was planned

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "pipeline": self.pipeline,
            "epoch": self.epoch,
            "attempt_token": self.attempt_token,
            "slices_with_tasks": list(self.slices_with_tasks),
            "lines": list(self.lines),
            "span": self.span,
            "backlog": self.backlog,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanResult:
        return cls(
            status=data["status"],
            pipeline=data["pipeline"],
            epoch=data.get("epoch"),
            attempt_token=data.get("attempt_token"),
            slices_with_tasks=tuple(data.get("slices_with_tasks", ())),
            lines=tuple(data.get("lines", ())),
            span=int(data.get("span", 0)),
            backlog=int(data.get("backlog", 0)),
        )


@dataclass(frozen=True)
class SliceGate:
    """Whether a process task has work (`Coordinator.slice_to_process`): the epoch to process when
    ``verdict`` is "process", and the line that says why either way."""

    verdict: SliceVerdict
    line: str
    epoch: Epoch | None = None


@dataclass(frozen=True)
class RecoveryReport:
    """What ``recover`` did, for the task log and ``onceflow recover --json``."""

    pipeline: str
    epoch: int | None = None
    outcome: RecoveryOutcome = "nothing in flight"
    reason: str = ""
    participants_committed: int = 0
    participants_aborted: int = 0
    orphans_aborted: tuple[Committable, ...] = field(default=())
    orphans_recommitted: tuple[Committable, ...] = field(default=())
    orphans_kept: tuple[Committable, ...] = field(default=())

    def summary(self) -> str:
        if self.epoch is None:
            head = f"pipeline {self.pipeline!r}: nothing in flight"
        elif self.outcome == "kept":
            head = f"pipeline {self.pipeline!r}: epoch {self.epoch} kept ({self.reason})"
        else:
            head = (
                f"pipeline {self.pipeline!r}: epoch {self.epoch} {self.outcome} "
                f"({self.participants_committed} participants committed, "
                f"{self.participants_aborted} aborted)"
            )
        kept = f", {len(self.orphans_kept)} kept (epoch in flight)" if self.orphans_kept else ""
        return (
            f"{head}; orphans: {len(self.orphans_aborted)} rolled back, "
            f"{len(self.orphans_recommitted)} re-committed{kept}"
        )

    def to_dict(self) -> dict[str, Any]:
        def ids(cs: Sequence[Committable]) -> list[dict[str, Any]]:
            return [{"epoch": c.epoch, "sink": c.sink, "task": c.task, "attempt": c.attempt} for c in cs]

        return {
            "pipeline": self.pipeline,
            "epoch": self.epoch,
            "outcome": self.outcome,
            "reason": self.reason,
            "participants_committed": self.participants_committed,
            "participants_aborted": self.participants_aborted,
            "orphans_aborted": ids(self.orphans_aborted),
            "orphans_recommitted": ids(self.orphans_recommitted),
            "orphans_kept": ids(self.orphans_kept),
        }
