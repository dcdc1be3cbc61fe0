"""The report step: a run's epoch in a few lines, the last lines of its log."""

from __future__ import annotations

from onceflow.ledger import Ledger


def report_lines(ledger: Ledger, pipeline: str, run_id: str) -> list[str]:
    """Status (with the abort reason), input ranges, records per sink and dead letters of the epoch the
    orchestrator run ``run_id`` planned (dead letters counted in the ledger, never loaded)."""
    epoch = ledger.epoch_of_run(pipeline, run_id)
    if epoch is None:
        return [f"run {run_id} planned no epoch of {pipeline!r}"]
    per_sink: dict[str, int] = {}
    for p in ledger.participants(pipeline, epoch.number):
        per_sink[p.sink] = per_sink.get(p.sink, 0) + p.record_count
    letters = ledger.dead_letter_count(pipeline, epoch=epoch.number, include_uncommitted=True)
    return [
        f"{epoch}" + (f" (abort reason: {epoch.abort_reason})" if epoch.abort_reason else ""),
        "  input: " + (", ".join(str(r) for r in epoch.ranges if not r.is_empty) or "nothing new"),
        *(f"  sink {sink}: {count} records" for sink, count in sorted(per_sink.items())),
        f"  dead letters: {letters}",
    ]
