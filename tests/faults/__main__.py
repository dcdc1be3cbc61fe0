"""`make faults N=... SEED=...`: a long seeded fault run (and the consistency table), with a report.

python -m tests.faults [--faults N] [--seed S] [--executor local|submit] [--no-table] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import psycopg

from onceflow.config import Settings
from tests.faults import harness


def _say(line: str) -> None:
    print(f"[onceflow faults] {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument("--faults", type=int, default=100, help="how many faults to inject (default 100)")
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a random one)")
    parser.add_argument("--executor", choices=("local", "submit"), default="local")
    parser.add_argument("--no-table", action="store_true", help="skip the consistency table")
    parser.add_argument("--out", type=Path, default=Path("tests/faults/out"), help="report folder")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    settings = Settings.from_env()
    root = Path(tempfile.mkdtemp(prefix="onceflow-faults-"))
    _say(f"seed {seed}: {args.faults} faults with the {args.executor} executor; scenario folders in {root}")
    violated = False
    with psycopg.connect(settings.pg_dsn, autocommit=True) as pg:
        scenario = harness.Scenario(harness.RECORDS, root, settings)
        scenario.create_topics()
        try:
            run = harness.run_faults(
                scenario,
                pg,
                harness.random_schedule(seed, args.faults),
                executor=args.executor,
                seed=seed,
                progress=_say,
            )
        finally:
            scenario.drop(pg)
        path = harness.write_report(args.out, f"faults-{seed}", run.to_dict(), harness.run_markdown(run))
        _say(f"report: {path}")
        violated = bool(run.violations or run.not_fired)
        if not args.no_table:
            _say("consistency table: the same fault schedule for each sink kind and source kind")
            table = harness.consistency_table(root, settings, pg)
            markdown = harness.table_markdown(table)
            data = {
                **table,
                "cells": {k: {s: t.to_dict() for s, t in v.items()} for k, v in table["cells"].items()},
            }
            _say(f"report: {harness.write_report(args.out, 'consistency-table', data, markdown)}")
            print(markdown)
            violated |= harness.observed_table(table) != harness.SEEDS_TABLE
    print(harness.run_markdown(run))
    return 1 if violated else 0


if __name__ == "__main__":
    sys.exit(main())
