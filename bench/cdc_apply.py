"""How `postgres_changes` applies changes, measured beside the way out it did not take.

A change stream's epoch can hold changes of one key in several read tasks. Two designs keep such an
epoch exactly once without tasks waiting on each other's row locks:

* **staged** (what `postgres_changes` does): each task copies its changes into a staging table inside its
  prepared transaction; the commit applies, in one statement per kind, the last change of each key;
* **one writer per key**: a partition's whole range is one task, which applies its changes row by row
  (upsert or delete, in source order) inside its prepared transaction; the commit only commits it.

Both run here on the same changes (60% inserts, 30% updates, 10% deletes of live keys, in source
order), into the stack's PostgreSQL, with the same number of tasks, each task's prepared transaction
made before any commit; the staged side through the sink's own writer and committer. The table then
must be the same. Prints the figures and, with ``--report``, writes them into bench/report.md's CDC
section.

    python -m bench.cdc_apply --changes 1000000 [--tasks 4] [--report bench/report.md]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from bench.report import write_section
from onceflow.sinks.base import TaskContext
from onceflow.sinks.postgres_changes import PostgresChangesCommitter, PostgresChangesWriter

COLUMNS = {"id": "bigint", "name": "text", "qty": "bigint"}
MARK_START, MARK_END = "<!-- cdc-apply -->", "<!-- /cdc-apply -->"


def changes(count: int, seed: int = 7) -> list[dict[str, Any]]:
    """``count`` changes in source order: 60% inserts of new keys, 30% updates and 10% deletes of live
    keys (a delete's row holds only its key)."""
    rng = random.Random(seed)
    live: list[int] = []
    out: list[dict[str, Any]] = []
    next_key = 0
    for offset in range(count):
        roll = rng.random()
        if roll < 0.6 or not live:
            live.append(next_key)
            out.append({"id": next_key, "name": f"n{offset}", "qty": offset, "_op": "c"})
            next_key += 1
        elif roll < 0.9:
            out.append({"id": rng.choice(live), "name": f"u{offset}", "qty": offset, "_op": "u"})
        else:
            key = live.pop(rng.randrange(len(live)))
            out.append({"id": key, "name": None, "qty": None, "_op": "d"})
        out[-1] |= {"_partition": 0, "_offset": offset}
    return out


def _table(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")
        conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, name text, qty bigint)")


def staged(dsn: str, rows: list[dict[str, Any]], tasks: int) -> tuple[float, float, str]:
    """The sink's own path: (seconds of the tasks' staging, seconds of the commit's apply)."""
    table = f"bench_apply_staged_{uuid.uuid4().hex[:6]}"
    _table(dsn, table)
    config = {"dsn": dsn, "table": table, "columns": COLUMNS, "key_columns": ["id"], "name": "db"}
    pipeline = f"bench-apply-{uuid.uuid4().hex[:6]}"
    size = -(-len(rows) // tasks)
    started = time.perf_counter()
    committables = []
    for n in range(tasks):
        writer = PostgresChangesWriter(config)
        writer.begin(TaskContext(pipeline, 1, 0, f"s0-t{n}", "a0", "db"))
        writer.write(rows[n * size : (n + 1) * size])
        committables.append(writer.pre_commit())
    staging = time.perf_counter() - started
    started = time.perf_counter()
    PostgresChangesCommitter(config).commit(committables)
    return staging, time.perf_counter() - started, table


def one_writer(dsn: str, rows: list[dict[str, Any]], tasks: int) -> tuple[float, float, str]:
    """One writer per key: rows dealt to tasks by key, each task applying its rows in source order in
    its own prepared transaction; the commit commits them."""
    table = f"bench_apply_direct_{uuid.uuid4().hex[:6]}"
    _table(dsn, table)
    upsert = (
        f"INSERT INTO {table} (id, name, qty) VALUES (%s, %s, %s) "
        "ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, qty = EXCLUDED.qty"
    )
    delete = f"DELETE FROM {table} WHERE id = %s"
    gids = []
    started = time.perf_counter()
    for n in range(tasks):
        mine = [r for r in rows if r["id"] % tasks == n]
        gid = f"bench-apply:{table}:{n}"
        with psycopg.connect(dsn) as conn:
            with conn.cursor() as cur:
                # Runs of one kind in one batch each, in source order.
                for deleting, run in itertools.groupby(mine, key=lambda r: r["_op"] == "d"):
                    if deleting:
                        cur.executemany(delete, [(r["id"],) for r in run])
                    else:
                        cur.executemany(upsert, [(r["id"], r["name"], r["qty"]) for r in run])
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
        gids.append(gid)
    writing = time.perf_counter() - started
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for gid in gids:
            conn.execute(f"COMMIT PREPARED '{gid}'")
    return writing, time.perf_counter() - started, table


def _content(dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT id, name, qty FROM {table} ORDER BY id").fetchall()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cdc_apply", description=__doc__)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--report", help="bench/report.md: write the figures into its CDC section")
    args = parser.parse_args(argv)
    dsn = os.environ["ONCEFLOW_PG_DSN"]
    rows = changes(args.changes)
    print(f"[bench] {len(rows):,} changes, {args.tasks} tasks", flush=True)
    stage_s, apply_s, staged_table = staged(dsn, rows, args.tasks)
    print(f"[bench] staged: tasks {stage_s:.1f} s, commit {apply_s:.1f} s", flush=True)
    write_s, commit_s, direct_table = one_writer(dsn, rows, args.tasks)
    print(f"[bench] one writer per key: tasks {write_s:.1f} s, commit {commit_s:.1f} s", flush=True)
    same = _content(dsn, staged_table) == _content(dsn, direct_table)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in (staged_table, direct_table, f"{staged_table}_onceflow_changes"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    if not same:
        raise SystemExit("[bench] the two designs left different tables: a bug, not a figure")
    staged_total, direct_total = stage_s + apply_s, write_s + commit_s
    lines = [
        MARK_START,
        "### Staged changes or one writer per key",
        "",
        "Why `postgres_changes` stages: the two ways around tasks that hold changes of one key, measured on",
        "the same changes (the staged side through the sink's own writer and committer).",
        "",
        f"Applying {len(rows):,} changes (60/30/10) in {args.tasks} tasks, measured by "
        "`python -m bench.cdc_apply` on the stack's PostgreSQL, both designs leaving the same table:",
        "",
        "| design | tasks (s) | commit (s) | total (s) | changes/s |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| staged, applied at commit (`postgres_changes`) | {stage_s:.1f} | {apply_s:.1f} | "
        f"{staged_total:.1f} | {len(rows) / staged_total:,.0f} |",
        f"| one writer per key, row by row | {write_s:.1f} | {commit_s:.1f} | {direct_total:.1f} | "
        f"{len(rows) / direct_total:,.0f} |",
        "",
        f"Staged is {direct_total / staged_total:.1f}x the other in total; its commit does the applying, "
        "so readers wait for it, while the other's tasks hold their row locks until the commit.",
        MARK_END,
    ]
    text = "\n".join(lines)
    print(text)
    if args.report:
        write_section(Path(args.report), text, MARK_START, MARK_END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
