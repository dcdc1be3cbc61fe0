"""Ledger overhead per epoch: plan + a slice of 64 pre-commits + decide + commit + complete, on SQLite and
PostgreSQL. The slice's driver registers its pre-commits in one transaction over its one connection.

Not a test. Run with the stack's settings exported (``eval "$(infra/services.sh env)"``):

    .venv/bin/python bench/ledger_bench.py [--epochs 20] [--warmup 3] [--participants 64]

PostgreSQL runs in a fresh database on ONCEFLOW_PG_DSN's server, dropped afterwards. Results go to
bench/out/ledger.json; the median milliseconds per epoch are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from onceflow.config import Settings
from onceflow.ledger import Ledger
from onceflow.offsets import OffsetRange
from onceflow.sinks.base import Committable
from onceflow.testing import RecordingCommitter, coordinator_for_tests

OUT = Path(__file__).resolve().parent / "out" / "ledger.json"


def run_epochs(ledger: Ledger, epochs: int, warmup: int, participants: int) -> list[float]:
    pipeline = f"bench-{uuid.uuid4().hex[:8]}"
    tasks = [("sink", f"t{i}") for i in range(participants)]
    committers = {"sink": RecordingCommitter(require_staged=False)}
    timings: list[float] = []
    for n in range(warmup + epochs):
        started = time.perf_counter()
        start = ledger.committed_offsets(pipeline).get(("in", 0), 0)
        epoch = ledger.plan_epoch(pipeline, [OffsetRange("in", 0, start, start + 1000)], tasks)
        committables = [
            Committable(pipeline, epoch.number, 0, task, "a0", sink, record_count=1000)
            for sink, task in tasks
        ]
        ledger.precommit_slice(pipeline, epoch.number, epoch.attempt_token, committables)
        coordinator_for_tests(ledger, pipeline, committers).commit(number=epoch.number)
        if n >= warmup:
            timings.append((time.perf_counter() - started) * 1000)
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--participants", type=int, default=64)
    args = parser.parse_args()
    settings = Settings.from_env()
    results: dict[str, dict[str, object]] = {}

    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger.connect(f"sqlite:///{tmp}/ledger.db", check=False)
        ledger.upgrade()
        results["sqlite"] = {"ms_per_epoch": run_epochs(ledger, args.epochs, args.warmup, args.participants)}
        ledger.close()

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        ledger = Ledger.connect(f"{settings.pg_dsn.rpartition('/')[0]}/{name}", check=False)
        ledger.upgrade()
        results["postgresql"] = {
            "ms_per_epoch": run_epochs(ledger, args.epochs, args.warmup, args.participants)
        }
        ledger.close()
    finally:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    for backend, result in results.items():
        timings = result["ms_per_epoch"]
        assert isinstance(timings, list)
        result["median_ms"] = round(statistics.median(timings), 2)
        result["p90_ms"] = round(sorted(timings)[int(0.9 * (len(timings) - 1))], 2)
        print(f"{backend:<10} {result['median_ms']:8.1f} ms/epoch median (p90 {result['p90_ms']:.1f})")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "what": "plan + one slice's pre-commits in one transaction + decide + commit + complete",
                "epochs": args.epochs,
                "warmup": args.warmup,
                "participants": args.participants,
                "results": results,
            },
            indent=2,
        )
    )
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
