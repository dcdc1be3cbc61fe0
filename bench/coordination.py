"""Coordination at scale: the ledger's work per epoch for a wide pipeline, and many pipelines at once.

    python -m bench.coordination [--partitions 1000] [--participants 512] [--sinks 4] [--slices 8]
                                 [--epochs 5] [--history 1000] [--keep-epochs 1000]
                                 [--pipelines 100] [--pipeline-partitions 16] [--pipeline-participants 8]
                                 [--concurrent-epochs 5] [--processes 2] [--epochs-per-minute 1]
                                 [--report bench/report.md] [--out bench/out] [--smoke]

1. One pipeline of ``--partitions`` input partitions and ``--participants`` (sink, task) participants
   (``--sinks`` sinks, registered by ``--slices`` slice drivers), on PostgreSQL and on SQLite, each epoch
   timed step by step: plan (the ledger reads `Coordinator.plan` makes, then `Ledger.plan_epoch`; Kafka's
   metadata is not part of it), pre-commits (`Ledger.precommit_slice` once per slice, one after another),
   decide (`Ledger.record_commit_decision`), commit (`Coordinator.commit`: participants committed and
   marked, the epoch completed), then retention (`Ledger.retain`, kept apart). The ledger first holds
   ``--history`` committed epochs of the same shape, as a pipeline has in steady state under the default
   retention.
   SQL statements per step are counted, to show where a step's time goes.
2. ``--pipelines`` pipelines sharing one PostgreSQL ledger, each running ``--concurrent-epochs`` epochs
   at the same time as all the others (threads in ``--processes`` client processes, each pipeline with
   its own connection, as separate Airflow workers would have).
3. Rows the ledger gains per epoch, their bytes on PostgreSQL, and rows per day at the given epoch rate,
   with and without retention.

The sinks' committers are **no-op committers** (`NothingToCommit`, the committer of sinks whose writes
are final): what is measured is the coordination (the ledger and the coordinator), not a sink's own
commit, which bench/commit_cost.py measures.
Results go to ``--out``/coordination.json; ``--report`` writes the section between its markers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import event, insert

from bench.ledgers import postgres_ledger, sqlite_ledger
from bench.report import write_section
from onceflow.committables import Committable
from onceflow.config import Settings
from onceflow.ledger import Ledger
from onceflow.ledger.models import EpochOffsetRow, EpochRow, ParticipantRow, PipelineRow
from onceflow.ledger.retention import RetentionPolicy
from onceflow.offsets import OffsetRange
from onceflow.protocol.coordinator import Coordinator
from onceflow.protocol.retaining import retention_interval
from onceflow.sinks._pg import NothingToCommit
from onceflow.testing import coordinator_for_tests

BEGIN = "<!-- coordination-bench -->"
END = "<!-- /coordination-bench -->"
STEPS = ("plan", "precommit", "decide", "commit")
TARGET_S = 2.0
SPAN = 100  # offsets each partition reads per epoch
TABLES = ("epochs", "epoch_offsets", "participants", "dead_letters")


@dataclass(frozen=True)
class Shape:
    """A pipeline's width: input partitions, and participants spread over sinks and slices."""

    partitions: int
    participants: int
    sinks: int
    slices: int

    def expected(self) -> list[tuple[str, str]]:
        return [
            (f"sink{i % self.sinks}", f"s{i % self.slices}-t{i // self.sinks}")
            for i in range(self.participants)
        ]

    def ranges(self, positions: dict[tuple[str, int], int]) -> list[OffsetRange]:
        return [
            OffsetRange("in", p, positions.get(("in", p), 0), positions.get(("in", p), 0) + SPAN)
            for p in range(self.partitions)
        ]

    def slices_of(self, pipeline: str, number: int) -> list[list[Committable]]:
        slices: list[list[Committable]] = [[] for _ in range(self.slices)]
        for i, (sink, task) in enumerate(self.expected()):
            part = int(task[1 : task.index("-")])
            # A task's read ranges travel in its committable: two partitions each, as 1,000 / 512 gives.
            inputs = tuple(
                OffsetRange("in", (2 * i + k) % self.partitions, (number - 1) * SPAN, number * SPAN)
                for k in (0, 1)
            )
            slices[part].append(
                Committable(
                    pipeline,
                    number,
                    part,
                    task,
                    "0",
                    sink,
                    inputs=inputs,
                    handle={"path": f"/staging/{pipeline}/{number}/{sink}/{task}/attempt-0", "files": 1},
                    record_count=SPAN * 2,
                )
            )
        return slices


# ------------------------------------------------------------------------------------ measuring


class StatementCounter:
    """Counts the SQL statements an engine sends, per named step (times only, without a ledger)."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        self.counts: Counter[str] = Counter()
        self.step = ""
        if ledger is not None:
            event.listen(ledger.engine, "before_cursor_execute", self._count)

    def _count(self, *_: Any) -> None:
        self.counts[self.step] += 1

    @contextmanager
    def timed(self, step: str, into: dict[str, float]) -> Iterator[None]:
        self.step = step
        started = time.perf_counter()
        try:
            yield
        finally:
            into[step] = time.perf_counter() - started
            self.step = ""


def seed_history(ledger: Ledger, pipeline: str, shape: Shape, epochs: int) -> None:
    """Write ``epochs`` committed epochs of ``shape`` straight into the tables, as retention leaves them."""
    if epochs <= 0:
        return
    now = datetime.now(UTC)
    pairs = shape.expected()
    expected = json.dumps([list(p) for p in sorted(pairs)])
    with ledger.engine.begin() as conn:
        conn.execute(insert(PipelineRow), [{"name": pipeline, "created_at": now}])
    for first in range(1, epochs + 1, 50):
        numbers = range(first, min(first + 50, epochs + 1))
        with ledger.engine.begin() as conn:
            conn.execute(
                insert(EpochRow),
                [
                    {
                        "pipeline": pipeline,
                        "epoch": n,
                        "status": "COMMITTED",
                        "attempt_token": uuid.uuid4().hex,
                        "expected_participants": expected,
                        "planned_at": now,
                        "decided_at": now,
                        "finished_at": now,
                    }
                    for n in numbers
                ],
            )
            conn.execute(
                insert(EpochOffsetRow),
                [
                    {
                        "pipeline": pipeline,
                        "epoch": n,
                        "topic": "in",
                        "partition": p,
                        "from_offset": (n - 1) * SPAN,
                        "until_offset": n * SPAN,
                    }
                    for n in numbers
                    for p in range(shape.partitions)
                ],
            )
            conn.execute(
                insert(ParticipantRow),
                [
                    {
                        "pipeline": pipeline,
                        "epoch": n,
                        "sink": c.sink,
                        "task": c.task,
                        "slice": c.slice,
                        "attempt": c.attempt,
                        "attempt_token": "seeded",
                        "committable": c.to_json(),
                        "staged_location": c.handle["path"],
                        "record_count": c.record_count,
                        "checksum": c.checksum,
                        "status": "COMMITTED",
                        "precommitted_at": now,
                        "finished_at": now,
                    }
                    for n in numbers
                    for part in shape.slices_of(pipeline, n)
                    for c in part
                ],
            )


def run_epoch(
    ledger: Ledger,
    coordinator: Coordinator,
    shape: Shape,
    counter: StatementCounter | None = None,
    policy: RetentionPolicy | None = None,
) -> dict[str, float]:
    """One epoch through every coordination step; seconds per step (and retention's, if a policy)."""
    pipeline = coordinator.pipeline
    counter = counter or StatementCounter()
    times: dict[str, float] = {}
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    with counter.timed("plan", times):
        ledger.epoch_of_run(pipeline, run_id)
        ledger.open_epoch(pipeline)
        ranges = shape.ranges(ledger.committed_offsets(pipeline))
        epoch = ledger.plan_epoch(
            pipeline, ranges, shape.expected(), run_id=run_id, owner=run_id, lease_s=120
        )
    slices = shape.slices_of(pipeline, epoch.number)
    with counter.timed("precommit", times):
        for committables in slices:
            ledger.precommit_slice(pipeline, epoch.number, epoch.attempt_token, committables)
    with counter.timed("decide", times):
        ledger.record_commit_decision(pipeline, epoch.number)
    with counter.timed("commit", times):
        done = coordinator.commit(number=epoch.number)
    assert done is not None and done.status.value == "COMMITTED", done
    if policy is not None:
        with counter.timed("retain", times):
            ledger.retain(pipeline, policy)
    return times


# ------------------------------------------------------------------------------------ the parts


def wide_pipeline(url: str, shape: Shape, epochs: int, history: int, keep: int) -> dict[str, Any]:
    """Part 1 on one ledger: per-epoch step times and statements, rows per epoch, retention's cost."""
    pipeline = f"wide-{uuid.uuid4().hex[:8]}"
    sinks = {f"sink{i}": NothingToCommit() for i in range(shape.sinks)}
    with Ledger.connect(url) as ledger:
        started = time.perf_counter()
        seed_history(ledger, pipeline, shape, history)
        seeded_s = time.perf_counter() - started
        # Test settings keep no retention after commits: retention is timed on its own below.
        coordinator = coordinator_for_tests(ledger, pipeline, sinks)
        counter = StatementCounter(ledger)
        policy = RetentionPolicy(keep_epochs=keep, dead_letter_age=timedelta(days=7))
        run_epoch(ledger, coordinator, shape)  # warm-up: connections, statement caches
        before = ledger.row_counts(pipeline)
        counter.counts.clear()
        rounds = [run_epoch(ledger, coordinator, shape, counter, policy) for _ in range(epochs)]
        after = ledger.row_counts(pipeline)
        # What a commit does every `retention_interval` epochs: one retention deleting that many epochs.
        every = retention_interval(keep)
        due = RetentionPolicy(keep_epochs=max(1, after["epochs"] - every), dead_letter_age=timedelta(days=7))
        spans: dict[str, float] = {}
        with counter.timed("retain_run", spans):
            run_deleted = ledger.retain(pipeline, due).deleted["epochs"]
        retained = ledger.row_counts(pipeline)
        bytes_per_row = _bytes_per_row(url) if ledger.engine.dialect.name == "postgresql" else None
    coordination = [sum(r[s] for s in STEPS) for r in rounds]
    return {
        "pipeline": pipeline,
        "history_epochs": history,
        "seed_s": round(seeded_s, 1),
        "epochs": epochs,
        "steps_s": {s: [round(r[s], 4) for r in rounds] for s in (*STEPS, "retain")},
        "median_s": {s: round(statistics.median(r[s] for r in rounds), 4) for s in (*STEPS, "retain")},
        "coordination_s": [round(c, 4) for c in coordination],
        "coordination_median_s": round(statistics.median(coordination), 4),
        "statements_per_epoch": {s: counter.counts[s] / epochs for s in (*STEPS, "retain")},
        "retention_run": {
            "every_epochs": every,
            "epochs_deleted": run_deleted,
            "seconds": round(spans["retain_run"], 4),
            "statements": counter.counts["retain_run"],
            "per_epoch_s": round(spans["retain_run"] / max(1, every), 4),
        },
        "rows_before": before,
        "rows_after_epochs": after,
        "rows_after_retention": retained,
        "bytes_per_row": bytes_per_row,
    }


def _bytes_per_row(url: str) -> dict[str, float]:
    """PostgreSQL's size of each table with its indexes, per row (after VACUUM so dead rows don't count)."""
    out: dict[str, float] = {}
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1), autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"VACUUM ANALYZE {table}")
            row = conn.execute(
                f"SELECT pg_total_relation_size('{table}'), (SELECT count(*) FROM {table})"
            ).fetchone()
            if row is not None and row[1]:
                out[table] = round(row[0] / row[1], 1)
    return out


def _pipeline_thread(
    url: str, name: str, shape: Shape, epochs: int, start_at: float, out: list[dict[str, Any]]
) -> None:
    with Ledger.connect(url) as ledger:
        coordinator = coordinator_for_tests(
            ledger, name, {f"sink{i}": NothingToCommit() for i in range(shape.sinks)}
        )
        run_epoch(ledger, coordinator, shape)  # warm-up, before the common start
        time.sleep(max(0.0, start_at - time.time()))
        for _ in range(epochs):
            started = time.time()
            times = run_epoch(ledger, coordinator, shape)
            out.append({"started": started, "ended": time.time(), **times})


def _pipelines_process(url: str, names: list[str], shape: Shape, epochs: int, start_at: float) -> list[Any]:
    out: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=_pipeline_thread, args=(url, n, shape, epochs, start_at, out)) for n in names
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def many_pipelines(url: str, pipelines: int, shape: Shape, epochs: int, processes: int) -> dict[str, Any]:
    """Part 2: every pipeline runs its epochs at the same time as the others, on one PostgreSQL ledger."""
    names = [f"many-{i:03d}-{uuid.uuid4().hex[:6]}" for i in range(pipelines)]
    groups = [names[i::processes] for i in range(processes)]
    start_at = time.time() + 2 + pipelines * 0.1  # every thread connects and warms up first
    with ProcessPoolExecutor(processes) as pool:
        futures = [pool.submit(_pipelines_process, url, g, shape, epochs, start_at) for g in groups]
        epochs_run = [e for f in futures for e in f.result()]
    assert len(epochs_run) == pipelines * epochs, "an epoch failed"
    wall = max(e["ended"] for e in epochs_run) - min(e["started"] for e in epochs_run)
    per_epoch = sorted(sum(e[s] for s in STEPS) for e in epochs_run)
    return {
        "pipelines": pipelines,
        "epochs_each": epochs,
        "processes": processes,
        "wall_s": round(wall, 2),
        "epochs_per_s": round(len(epochs_run) / wall, 2),
        "coordination_median_s": round(statistics.median(per_epoch), 4),
        "coordination_p95_s": round(per_epoch[int(0.95 * (len(per_epoch) - 1))], 4),
        "coordination_max_s": round(per_epoch[-1], 4),
        "median_s": {s: round(statistics.median(e[s] for e in epochs_run), 4) for s in STEPS},
    }


def projection(
    shape: Shape, bytes_per_row: dict[str, float] | None, per_minute: float, keep: int
) -> dict[str, Any]:
    """Rows (and bytes) per epoch, per day without retention, and the bound retention keeps."""
    rows = {"epochs": 1, "epoch_offsets": shape.partitions, "participants": shape.participants}
    per_epoch = sum(rows.values())
    size = None if not bytes_per_row else sum(rows[k] * bytes_per_row.get(k, 0.0) for k in rows)
    per_day = per_epoch * per_minute * 1440
    return {
        "epochs_per_minute": per_minute,
        "rows_per_epoch": rows,
        "rows_per_epoch_total": per_epoch,
        "bytes_per_epoch": None if size is None else round(size),
        "rows_per_day_without_retention": round(per_day),
        "bytes_per_day_without_retention": None if size is None else round(size * per_minute * 1440),
        "rows_kept_with_retention": per_epoch * keep,
        "bytes_kept_with_retention": None if size is None else round(size * keep),
        "hours_to_reach_the_bound": round(keep / per_minute / 60, 1),
    }


# ------------------------------------------------------------------------------------ the report


def _s(x: float) -> str:
    return f"{x:.3f}"


def section(results: dict[str, Any]) -> str:
    shape, conf = results["shape"], results["config"]
    wide = results["wide"]
    pg = wide["postgresql"]
    met = pg["coordination_median_s"] <= TARGET_S
    lines = [
        BEGIN,
        "## Coordination at scale",
        "",
        f"Measured by `{results['command']}` on {results['when']} (load average {results['load']}, "
        f"{os.cpu_count()} cores). Sinks use a **no-op committer**: what is timed is the coordination "
        "(ledger and coordinator), not a sink's own commit (see the commit-time section for that).",
        "",
        f"**Target: coordination <= {TARGET_S:.0f} s per epoch at {shape['partitions']:,} partitions / "
        f"{shape['participants']} participants on PostgreSQL: {'met' if met else 'missed'}** "
        f"({_s(pg['coordination_median_s'])} s median over {pg['epochs']} epochs, with "
        f"{pg['history_epochs']:,} committed epochs of the same shape already in the ledger).",
        "",
        f"One pipeline, {shape['partitions']:,} partitions, {shape['participants']} participants "
        f"({shape['sinks']} sinks, registered by {shape['slices']} slice drivers one after another); "
        "seconds per epoch, median, and SQL statements per epoch:",
        "",
        "| ledger | plan | pre-commits | decide | commit | **coordination** | retention every epoch | "
        "retention every N epochs, per epoch |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, r in wide.items():
        st = r["statements_per_epoch"]
        cells = [f"{_s(r['median_s'][s])} ({st[s]:.0f} stmts)" for s in (*STEPS,)]
        worst = _s(max(r["coordination_s"]))
        retain = f"{_s(r['median_s']['retain'])} ({st['retain']:.0f} stmts)"
        total = f"**{_s(r['coordination_median_s'])}** (max {worst})"
        run = r["retention_run"]
        amortized = (
            f"{_s(run['per_epoch_s'])} (one run of {_s(run['seconds'])} s deleting {run['epochs_deleted']} "
            f"epochs, N = {run['every_epochs']})"
        )
        lines.append(f"| {backend} | {' | '.join(cells)} | {total} | {retain} | {amortized} |")
    many = results.get("many")
    if many:
        lines += [
            "",
            f"{many['pipelines']} pipelines sharing one PostgreSQL ledger, each "
            f"{conf['pipeline_partitions']} partitions / {conf['pipeline_participants']} participants, "
            f"{many['epochs_each']} epochs each, all at once ({many['processes']} client processes, "
            "one connection per pipeline): "
            f"{many['epochs_per_s']} epochs/s in all, coordination per epoch median "
            f"{_s(many['coordination_median_s'])} s, "
            f"p95 {_s(many['coordination_p95_s'])} s, max {_s(many['coordination_max_s'])} s "
            f"(plan {_s(many['median_s']['plan'])}, pre-commits {_s(many['median_s']['precommit'])}, "
            f"decide {_s(many['median_s']['decide'])}, commit {_s(many['median_s']['commit'])}). "
            "The clients share the machine's cores with PostgreSQL.",
        ]
    keep, every = conf["keep_epochs"], pg["retention_run"]["every_epochs"]
    deleted = pg["retention_run"]["epochs_deleted"]
    proj = results["projection"]
    bpe = proj["bytes_per_epoch"]
    lines += [
        "",
        f"Ledger growth of that pipeline: {proj['rows_per_epoch_total']:,} rows per epoch "
        f"({', '.join(f'{v:,} {k}' for k, v in proj['rows_per_epoch'].items())})"
        + (f", about {bpe / 1e6:.2f} MB on PostgreSQL with indexes" if bpe else "")
        + ":",
        "",
        "| epochs per minute | rows per day without retention | with retention (kept for good) |",
        "| --- | --- | --- |",
    ]
    for p in results["projections"]:
        size = (
            f" ({p['bytes_per_day_without_retention'] / 1e9:.1f} GB)"
            if p["bytes_per_day_without_retention"]
            else ""
        )
        kept = f" ({p['bytes_kept_with_retention'] / 1e9:.2f} GB)" if p["bytes_kept_with_retention"] else ""
        lines.append(
            f"| {p['epochs_per_minute']:g} | {p['rows_per_day_without_retention']:,}{size} | "
            f"{p['rows_kept_with_retention']:,}{kept}, reached after {p['hours_to_reach_the_bound']:g} h |"
        )
    lines += [
        "",
        f"With retention (`ONCEFLOW_RETAIN_EPOCHS={keep}`, applied by a commit every {every} epochs) "
        f"a pipeline keeps between {keep:,} and {keep + every - 1:,} committed epochs. The PostgreSQL ledger "
        f"of the run held {_rows(pg['rows_before'])} before the timed epochs, "
        f"{_rows(pg['rows_after_epochs'])} after them (retention after each) and "
        f"{_rows(pg['rows_after_retention'])} after the retention run that deleted {deleted} epochs.",
        END,
    ]
    return "\n".join(lines)


def _rows(counts: dict[str, int]) -> str:
    return f"{counts['epochs']:,} epochs ({sum(counts.values()):,} rows)"


# ------------------------------------------------------------------------------------------ main


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    shape = Shape(args.partitions, args.participants, args.sinks, args.slices)
    small = Shape(args.pipeline_partitions, args.pipeline_participants, 1, 1)
    wide: dict[str, Any] = {}
    many: dict[str, Any] | None = None
    with postgres_ledger(settings.pg_dsn) as url:
        wide["postgresql"] = wide_pipeline(url, shape, args.epochs, args.history, args.keep_epochs)
        if args.pipelines:
            many = many_pipelines(url, args.pipelines, small, args.concurrent_epochs, args.processes)
    with tempfile.TemporaryDirectory() as tmp, sqlite_ledger(Path(tmp)) as url:
        wide["sqlite"] = wide_pipeline(url, shape, args.epochs, args.history, args.keep_epochs)
    rates = sorted({args.epochs_per_minute, 1.0, 12.0})
    bytes_per_row = wide["postgresql"]["bytes_per_row"]
    return {
        "command": "python -m bench.coordination " + " ".join(sys.argv[1:]),
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "load": [round(x, 2) for x in os.getloadavg()],
        "shape": shape.__dict__,
        "config": {
            "keep_epochs": args.keep_epochs,
            "pipeline_partitions": args.pipeline_partitions,
            "pipeline_participants": args.pipeline_participants,
        },
        "committer": "NothingToCommit (does nothing: coordination only)",
        "wide": wide,
        "many": many,
        "projection": projection(shape, bytes_per_row, args.epochs_per_minute, args.keep_epochs),
        "projections": [projection(shape, bytes_per_row, r, args.keep_epochs) for r in rates],
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.coordination", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--partitions", type=int, default=1000)
    add("--participants", type=int, default=512)
    add("--sinks", type=int, default=4)
    add("--slices", type=int, default=8)
    add("--epochs", type=int, default=5, help="timed epochs of the wide pipeline, per ledger")
    add("--history", type=int, default=1000, help="committed epochs in the ledger before timing")
    add("--keep-epochs", type=int, default=1000, help="retention's committed epochs kept")
    add("--pipelines", type=int, default=100, help="pipelines sharing one PostgreSQL ledger (0: skip)")
    add("--pipeline-partitions", type=int, default=16)
    add("--pipeline-participants", type=int, default=8)
    add("--concurrent-epochs", type=int, default=5, help="epochs each of those pipelines runs")
    add("--processes", type=int, default=2, help="client processes running those pipelines")
    add("--epochs-per-minute", type=float, default=1.0, help="epoch rate of the growth projection")
    add("--report", type=Path, default=None, help="write the section into this markdown file")
    add("--out", type=Path, default=Path(__file__).resolve().parent / "out")
    add("--smoke", action="store_true", help="tiny sizes: checks the harness in seconds")
    return parser


SMOKE = {
    "partitions": 20,
    "participants": 12,
    "sinks": 2,
    "slices": 3,
    "epochs": 2,
    "history": 4,
    "keep_epochs": 3,
    "pipelines": 4,
    "pipeline_partitions": 4,
    "pipeline_participants": 2,
    "concurrent_epochs": 2,
    "processes": 2,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    results = run(args, Settings.from_env())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "coordination.json").write_text(json.dumps(results, indent=2))
    text = section(results)
    print(text)
    if args.report is not None:
        write_section(args.report, text, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
