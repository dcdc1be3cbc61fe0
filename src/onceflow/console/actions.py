"""The console's guarded actions: commit, abort and recover, through the same `Coordinator` as the CLI.

Nothing is decided here: the coordinator (`onceflow.protocol.decisions`) refuses what the invariants forbid,
and `refusal_line` words a refusal exactly as ``onceflow commit|abort`` prints it (after its ``onceflow:``
prefix), so an operator reads the same sentence in the console, the task log and the terminal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from onceflow import redact
from onceflow.errors import OnceflowError, one_line

if TYPE_CHECKING:
    from onceflow.config import Settings
    from onceflow.ledger import Ledger
    from onceflow.pipeline import Pipeline

Action = Literal["commit", "abort", "recover"]
Outcome = Literal["done", "refused", "error"]
ACTIONS: tuple[Action, ...] = ("commit", "abort", "recover")


def refusal_line(exc: BaseException) -> str:
    """A refusal on one line: the invariants' own (`Refused`) begin with e.g. "commit refused: " already;
    any other refused transition (participants missing, a stale token) is prefixed "refused: "."""
    from onceflow.ledger import Refused

    line = one_line(exc)
    return line if isinstance(exc, Refused) else f"refused: {line}"


@dataclass(frozen=True)
class ActionResult:
    """What an action did: ``done`` (with the epoch's status after it), ``refused`` by the invariants
    (nothing changed), or ``error`` (e.g. a sink still down: retry later); ``line`` says which, and
    ``log`` holds the coordinator's own lines ("already committed ... nothing changed", ...)."""

    action: Action
    pipeline: str
    epoch: int | None
    outcome: Outcome
    line: str
    status: str | None = None
    log: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The console's response: its lines through `redact.text` (an error may quote a sink's DSN)."""
        return {
            "action": self.action,
            "pipeline": self.pipeline,
            "epoch": self.epoch,
            "outcome": self.outcome,
            "line": redact.text(self.line),
            "status": self.status,
            "log": [redact.text(line) for line in self.log],
        }


def run_action(
    ledger: Ledger,
    settings: Settings,
    pipeline: str,
    action: str,
    *,
    by: str,
    epoch: int | None = None,
    force: bool = False,
    find_spec: Callable[[str], Pipeline] | None = None,
) -> ActionResult:
    """Run ``action`` on ``pipeline`` (``epoch`` for commit and abort) as the CLI would; ``by`` names
    who acted, for the abort reason the ledger records.

    1. Check the request: a known action, an epoch number for commit and abort.
    2. Find the pipeline's spec (ONCEFLOW_PIPELINES, as the CLI does): its committers do the work.
    3. Call the coordinator's method; a refusal of the invariants becomes ``refused`` with the CLI's
       words, any other onceflow error ``error`` with its one line.
    """
    from onceflow.catalog import find_pipeline
    from onceflow.ledger import IllegalTransition, PrecommitRefused
    from onceflow.protocol.coordinator import Coordinator

    # 1.
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: expected one of {', '.join(ACTIONS)}")
    name: Action = action
    if name != "recover" and epoch is None:
        raise ValueError(f"{name} needs an epoch number")
    lines: list[str] = []
    try:
        # 2.
        spec = find_spec(pipeline) if find_spec else find_pipeline(pipeline, settings.pipelines)
        coordinator = Coordinator.for_pipeline(spec, ledger, settings, log=lines.append)
        # 3.
        if name == "recover":
            report = coordinator.recover(by=f"{by} (recover{' --force' if force else ''})", force=force)
            return ActionResult(name, pipeline, report.epoch, "done", report.summary(), log=tuple(lines))
        if name == "commit":
            done = coordinator.commit(number=epoch)
        else:
            done = coordinator.abort(number=epoch, reason=f"aborted by hand with {by}")
    except (IllegalTransition, PrecommitRefused) as exc:
        return ActionResult(name, pipeline, epoch, "refused", refusal_line(exc), log=tuple(lines))
    except OnceflowError as exc:
        return ActionResult(name, pipeline, epoch, "error", f"error: {one_line(exc)}", log=tuple(lines))
    if done is None:
        return ActionResult(
            name, pipeline, epoch, "done", lines[-1] if lines else "nothing to do", log=tuple(lines)
        )
    return ActionResult(name, pipeline, epoch, "done", f"{done}", str(done.status), tuple(lines))
