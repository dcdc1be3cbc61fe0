"""Where a stateful pipeline's state snapshots live, and how they join the epoch's participants.

The snapshot of epoch n is the full state after epoch n, written by the slice job as the output of an
internal ``files`` sink named `STATE_SINK` in ``replace`` mode. Being a participant is what gives state
the same guarantees as output: it is staged per task attempt, counts toward the decision, becomes
visible with the epoch's commit (its log entry replaces the previous snapshot), is discarded on abort and
swept when orphaned. Superseded snapshots are deleted one epoch later (see `onceflow.sinks.files`).
"""

from __future__ import annotations

from pathlib import Path

from onceflow.config import Settings
from onceflow.pipeline import STATE_SINK, Pipeline, SinkSpec
from onceflow.sinks.files import committed_files

STATE_TABLE = "state"


def state_root(spec: Pipeline, settings: Settings) -> Path:
    """The folder of the pipeline's snapshots: ``state.root``, else ``{settings.home}/state/{pipeline}``."""
    if spec.state is None:
        raise ValueError(f"pipeline {spec.name!r} declares no state")
    if spec.state.root is not None:
        return Path(spec.state.root) / spec.name
    return settings.home / "state" / spec.name


def state_sink(spec: Pipeline, settings: Settings) -> SinkSpec | None:
    """The internal sink that stages and commits the pipeline's state snapshot (None when stateless)."""
    if spec.state is None:
        return None
    return SinkSpec(
        STATE_SINK,
        "files",
        {"root": str(state_root(spec, settings)), "table": STATE_TABLE, "mode": "replace"},
    )


def committed_state_files(spec: Pipeline, settings: Settings) -> list[Path]:
    """The Parquet files of the last committed snapshot (none before the first committed epoch)."""
    return committed_files(state_root(spec, settings) / STATE_TABLE)
