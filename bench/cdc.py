"""Change data capture: changes applied per second, onceflow beside Debezium's JDBC sink connector.

    python -m bench.cdc [--changes 1e6] [--partitions 4] [--epoch-records 300000] [--jdbc-tasks 4]
                        [--jdbc-batch 5000] [--iceberg] [--jdbc-first] [--report bench/report.md]
                        [--json FILE] [--render FILE]

1. A source table in the stack's PostgreSQL, captured by Debezium's PostgreSQL connector on the stack's
   Kafka Connect (JSON with its schemas: the JDBC sink needs them) into a topic of ``--partitions``.
2. ``--changes`` changes made with SQL in ten large transactions, each 60 % inserts, 30 % updates and
   10 % deletes of random live rows (a delete also writes its tombstone); the bench waits until all of
   them are in Kafka and times that too (Debezium's capture, for context).
3. On that topic, one after the other: onceflow's `postgres_changes` pipeline through `onceflow run
   --until-caught-up` on the stack's Spark runtime (exactly once: staged in prepared transactions,
   applied per key at the commit), timed from the command's start to its end; then Debezium's JDBC sink
   connector (upsert, deletes on, key from the record key; at least once), timed from its registration
   until its consumer group's committed offsets reach the end of the topic and its table equals the
   source (``--jdbc-first``: the other way round). With ``--iceberg``, the `iceberg_changes` pipeline
   too, last, timed like the first.
4. Each mirror must equal the source table row for row, or the bench fails. Changes/s is the number of
   changes made (tombstones not counted) over the seconds of each system.

The worker needs Debezium's JDBC sink connector (``ONCEFLOW_CONNECT_JDBC_SINK=1 infra/connect.sh
restart``, which this bench runs when the worker lacks it). Everything it makes is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from onceflow.config import Settings
from onceflow.pipeline import Debezium, JsonFormat, KafkaSource, Pipeline, SinkSpec

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- cdc-bench -->"
END = "<!-- /cdc-bench -->"
JDBC_SINK = "io.debezium.connector.jdbc.JdbcSinkConnector"
TARGET_RATIO = 1.0
COLUMNS = ("id", "name", "qty", "price", "updated_at")
TABLE_DDL = (
    "(id integer PRIMARY KEY, name text NOT NULL, qty integer, price numeric(10, 2), "
    "updated_at timestamptz NOT NULL DEFAULT now())"
)
# What the pipeline reads (Debezium's JSON with its schemas) and what its PostgreSQL mirror holds.
SCHEMA = {"id": "int", "name": "string", "qty": "int?", "price": "decimal(10,2)?", "updated_at": "timestamp"}
MIRROR_COLUMNS = {
    "id": "integer",
    "name": "text",
    "qty": "integer",
    "price": "numeric(10,2)",
    "updated_at": "timestamptz",
}
ICEBERG_COLUMNS = {
    "id": "long",
    "name": "string",
    "qty": "long",
    "price": "decimal(10,2)",
    "updated_at": "timestamptz",
}
ROUNDS = 10
TASK_RECORDS = 50_000
DEFAULT_OPTIONS = {"epoch_records": 300_000, "jdbc_tasks": 4, "jdbc_batch": 5000}


def __getattr__(name: str) -> Pipeline:
    """``PIPELINE`` for `onceflow run bench.cdc:PIPELINE`, built from the bench's environment."""
    if name != "PIPELINE":
        raise AttributeError(name)
    env = os.environ
    if env["ONCEFLOW_BENCH_CDC_SINK"] == "iceberg_changes":
        from onceflow.sinks.iceberg import default_catalog_properties

        sink = SinkSpec(
            "mirror",
            "iceberg_changes",
            {
                "table": env["ONCEFLOW_BENCH_CDC_TABLE"],
                "catalog": "bench_cdc",
                "catalog_properties": default_catalog_properties(Path(env["ONCEFLOW_BENCH_CDC_WAREHOUSE"])),
                "columns": ICEBERG_COLUMNS,
                "key_columns": ["id"],
            },
        )
    else:
        sink = SinkSpec(
            "mirror",
            "postgres_changes",
            {"table": env["ONCEFLOW_BENCH_CDC_TABLE"], "columns": MIRROR_COLUMNS, "key_columns": ["id"]},
        )
    return Pipeline(
        name=env["ONCEFLOW_BENCH_CDC_PIPELINE"],
        source=KafkaSource(topics=(env["ONCEFLOW_BENCH_CDC_TOPIC"],)),
        format=JsonFormat(schema=SCHEMA, changes=Debezium(key=("id",))),
        sinks=(sink,),
        max_records_per_partition=int(env["ONCEFLOW_BENCH_CDC_EPOCH_RECORDS"]),
        max_records_per_task=TASK_RECORDS,
    )


@dataclass
class SystemRun:
    """One system's pass over the topic."""

    system: str
    seconds: float
    changes_per_s: float
    matches: bool
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class CdcResult:
    """What one run made and measured (``--json`` writes it, ``--render`` reads it back)."""

    changes: int
    inserts: int
    updates: int
    deletes: int
    records: int
    partitions: int
    capture_s: float
    rows_at_end: int
    runs: list[SystemRun]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    command: str
    when: str
    runtime: str
    options: dict[str, int] = field(default_factory=dict)
    record_bytes: int = 0


# --- the stack: Kafka Connect with the JDBC sink --------------------------------------------------------


def ensure_jdbc_sink() -> None:
    """Restart the stack's Connect worker with the JDBC sink on its plugin path unless it has it."""
    from tests.cdc import request

    if any(p["class"] == JDBC_SINK for p in request("GET", "/connector-plugins")):
        return
    print("[bench.cdc] restarting Kafka Connect with the JDBC sink connector", file=sys.stderr)
    env = {**os.environ, "ONCEFLOW_CONNECT_JDBC_SINK": "1"}
    subprocess.run(
        [str(ROOT / "infra" / "connect.sh"), "restart"], env=env, check=True, stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while not any(p["class"] == JDBC_SINK for p in request("GET", "/connector-plugins")):
        if time.monotonic() > deadline:
            raise RuntimeError("Kafka Connect restarted without the JDBC sink connector")
        time.sleep(1)


# --- the source: table, connector, changes --------------------------------------------------------------


@contextmanager
def captured_table(settings: Settings, partitions: int) -> Iterator[tuple[str, Any]]:
    """A new source table and a Debezium connector capturing it into a topic of ``partitions``."""
    import psycopg
    from tests.cdc import register_postgres_connector

    table = f"cdc_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} {TABLE_DDL}")
        conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    connector = None
    try:
        connector = register_postgres_connector(
            settings.pg_dsn,
            [f"public.{table}"],
            "json",
            extra={"topic.creation.default.partitions": str(partitions)},
        )
        connector.wait_running(timeout_s=120)
        _wait_for_slot(settings.pg_dsn, connector.slot)
        yield table, connector
    finally:
        if connector is not None:
            connector.delete()
            _delete_topics(settings, [connector.topic(table)])
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


def _wait_for_slot(dsn: str, slot: str, timeout_s: float = 120) -> None:
    """Until the connector streams from its slot: changes made before would be read by no one."""
    import psycopg

    deadline = time.monotonic() + timeout_s
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.5)
    raise RuntimeError(f"replication slot {slot} not streaming after {timeout_s}s")


def split(changes: int) -> tuple[int, int, int]:
    """Inserts, updates and deletes: 60 / 30 / 10 % of ``changes``, in ROUNDS equal rounds."""
    per_round = max(changes // ROUNDS, 10)
    inserts, updates = per_round * 6 // 10, per_round * 3 // 10
    deletes = per_round - inserts - updates
    return inserts * ROUNDS, updates * ROUNDS, deletes * ROUNDS


def make_changes(dsn: str, table: str, changes: int) -> tuple[int, int, int]:
    """ROUNDS transactions, each inserting new ids, then updating and deleting random live rows."""
    import psycopg

    inserts, updates, deletes = (n // ROUNDS for n in split(changes))
    next_id = 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT setseed(0.42)")
        for _ in range(ROUNDS):
            with conn.transaction():
                conn.execute(
                    f"INSERT INTO {table} (id, name, qty, price) SELECT g, 'name-' || g, g %% 100, "
                    "(g %% 100000) / 100.0 FROM generate_series(%s::int, %s::int) g",
                    (next_id, next_id + inserts - 1),
                )
                next_id += inserts
                updated = conn.execute(
                    f"UPDATE {table} SET qty = coalesce(qty, 0) + 1, price = price + 0.01, "
                    f"name = name || '+', updated_at = clock_timestamp() WHERE id IN "
                    f"(SELECT id FROM {table} ORDER BY random() LIMIT %s)",
                    (updates,),
                ).rowcount
                deleted = conn.execute(
                    f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} ORDER BY random() LIMIT %s)",
                    (deletes,),
                ).rowcount
                if (updated, deleted) != (updates, deletes):
                    raise RuntimeError(f"round changed {updated}/{deleted} rows, not {updates}/{deletes}")
    return inserts * ROUNDS, updates * ROUNDS, deletes * ROUNDS


def end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    """Each partition's high watermark (0 for a topic not there yet)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "bench-cdc-watermarks"})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return {}
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in sorted(metadata.partitions)
        }
    finally:
        consumer.close()


def wait_for_records(settings: Settings, topic: str, records: int, timeout_s: float) -> None:
    """Until ``records`` records are in ``topic`` (Debezium has captured every change)."""
    deadline = time.monotonic() + timeout_s
    total = 0
    while time.monotonic() < deadline:
        total = sum(end_offsets(settings, topic).values())
        if total >= records:
            if total > records:
                raise RuntimeError(f"{topic} holds {total} records, more than the {records} expected")
            return
        time.sleep(1)
    raise RuntimeError(f"{topic}: {total} of {records} records after {timeout_s}s")


def record_bytes(settings: Settings, topic: str, count: int = 2000) -> int:
    """Average key plus value bytes of the first ``count`` records of the topic's partition 0."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": "bench-cdc-sizes",
            "enable.auto.commit": False,
        }
    )
    sizes: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        while len(sizes) < count:
            message = consumer.poll(5)
            if message is None:
                break
            if not message.error():
                sizes.append(len(message.key() or b"") + len(message.value() or b""))
    finally:
        consumer.close()
    return sum(sizes) // max(len(sizes), 1)


def _delete_topics(settings: Settings, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    existing = set(admin.list_topics(timeout=10).topics)
    doomed = [t for t in topics if t in existing]
    for future in admin.delete_topics(doomed).values() if doomed else ():
        future.result(timeout=30)


# --- comparing the mirrors ------------------------------------------------------------------------------


def differing_rows(dsn: str, source: str, mirror: str) -> int:
    """Rows in one table and not in the other, both ways (0: equal row for row)."""
    import psycopg

    cols = ", ".join(COLUMNS)
    with psycopg.connect(dsn, autocommit=True) as conn:
        one_way = "SELECT count(*) FROM (SELECT {c} FROM {a} EXCEPT ALL SELECT {c} FROM {b}) d"
        row = conn.execute(
            f"SELECT ({one_way.format(c=cols, a=source, b=mirror)}) + "
            f"({one_way.format(c=cols, a=mirror, b=source)})"
        ).fetchone()
    return int(row[0]) if row else -1


def iceberg_differing_rows(dsn: str, source: str, catalog_properties: Mapping[str, str], table: str) -> int:
    """Rows of the Iceberg mirror (read with pyiceberg) and of the source that are not in both."""
    import psycopg
    from pyiceberg.catalog import load_catalog

    scan = load_catalog("bench_cdc", **catalog_properties).load_table(table).scan().to_arrow()
    mirror = {(r["id"], r["name"], r["qty"], r["price"], r["updated_at"]) for r in scan.to_pylist()}
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM {source}").fetchall()
    wanted = {(r[0], r[1], r[2], r[3], r[4].replace(tzinfo=None) if _naive(scan) else r[4]) for r in rows}
    return len(mirror ^ wanted) + abs(int(scan.num_rows) - len(mirror))


def _naive(arrow_table: Any) -> bool:
    return getattr(arrow_table.schema.field("updated_at").type, "tz", None) is None


# --- the systems ----------------------------------------------------------------------------------------


def run_onceflow(
    settings: Settings, topic: str, sink: str, table: str, epoch_records: int, workdir: Path
) -> tuple[float, dict[str, Any]]:
    """Seconds of `onceflow run bench.cdc:PIPELINE --until-caught-up` (a ledger of its own), and the
    seconds of its epochs' steps as the command reports them."""
    from bench.ledgers import sqlite_ledger

    pipeline = f"bench-cdc-{sink.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    with sqlite_ledger(workdir) as ledger_url:
        pass
    env = {
        **os.environ,
        **settings.as_env(),
        "ONCEFLOW_LEDGER_URL": ledger_url,
        "ONCEFLOW_PIPELINES": "bench.cdc:PIPELINE",
        "ONCEFLOW_BENCH_CDC_SINK": sink,
        "ONCEFLOW_BENCH_CDC_TABLE": table,
        "ONCEFLOW_BENCH_CDC_TOPIC": topic,
        "ONCEFLOW_BENCH_CDC_PIPELINE": pipeline,
        "ONCEFLOW_BENCH_CDC_EPOCH_RECORDS": str(epoch_records),
        "ONCEFLOW_BENCH_CDC_WAREHOUSE": str(workdir / "iceberg"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    log = workdir / f"onceflow-{sink}.log"
    started = time.perf_counter()
    with log.open("w") as out:
        result = subprocess.run(
            [sys.executable, "-m", "onceflow.cli", "run", pipeline, "--until-caught-up"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    seconds = time.perf_counter() - started
    sys.stderr.write(log.read_text()[-20_000:])
    if result.returncode != 0:
        raise RuntimeError(f"onceflow run ({sink}) exited {result.returncode}: {log.read_text()[-3000:]}")
    return seconds, epoch_steps(log.read_text())


EPOCH_LINE = re.compile(
    r"^epoch \d+ of pipeline .*plan ([\d.]+) s \+ process ([\d.]+) s \+ commit ([\d.]+) s", re.M
)


def epoch_steps(output: str) -> dict[str, Any]:
    """The epochs and the seconds of their plan, process and commit steps, summed, from the output of
    `onceflow run` (one line per committed epoch)."""
    steps = [tuple(float(x) for x in m.groups()) for m in EPOCH_LINE.finditer(output)]
    return {
        "epochs": len(steps),
        "plan_s": round(sum(s[0] for s in steps), 2),
        "process_s": round(sum(s[1] for s in steps), 2),
        "commit_s": round(sum(s[2] for s in steps), 2),
    }


def jdbc_config(settings: Settings, topic: str, table: str, tasks: int, batch: int) -> dict[str, str]:
    from psycopg.conninfo import conninfo_to_dict
    from tests.cdc import converter_config

    params = conninfo_to_dict(settings.pg_dsn)
    return {
        "connector.class": JDBC_SINK,
        "tasks.max": str(tasks),
        "topics": topic,
        "connection.url": f"jdbc:postgresql://{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}/"
        f"{params['dbname']}",
        "connection.username": str(params["user"]),
        "connection.password": str(params.get("password", "")),
        "insert.mode": "upsert",
        "delete.enabled": "true",
        "primary.key.mode": "record_key",
        "primary.key.fields": "id",
        "schema.evolution": "none",
        "collection.name.format": table,
        "batch.size": str(batch),
        # Several changes of one key within a batch become its last one (what onceflow does per epoch).
        "use.reduction.buffer": "true",
        "consumer.override.auto.offset.reset": "earliest",
        **converter_config("json"),
    }


def run_jdbc_sink(
    settings: Settings, topic: str, source: str, table: str, tasks: int, batch: int, timeout_s: float
) -> tuple[float, dict[str, Any]]:
    """Seconds from registering the JDBC sink until its group is at the end of the topic and its table
    equals the source."""
    import psycopg
    from confluent_kafka import Consumer, TopicPartition
    from tests.cdc import ConnectError, request

    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} {TABLE_DDL}")
    name = f"bench-jdbc-{uuid.uuid4().hex[:8]}"
    ends = end_offsets(settings, topic)
    group = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"connect-{name}"})
    wanted = [TopicPartition(topic, p) for p in ends]
    started = time.perf_counter()
    request("PUT", f"/connectors/{name}/config", jdbc_config(settings, topic, table, tasks, batch))
    try:
        caught_up_s = None
        while True:
            elapsed = time.perf_counter() - started
            if elapsed > timeout_s:
                raise RuntimeError(
                    f"JDBC sink not done after {timeout_s}s: {request('GET', f'/connectors/{name}/status')}"
                )
            try:
                status = request("GET", f"/connectors/{name}/status")
            except ConnectError:  # not known yet right after the config was put
                status = {}
            failed = [t for t in status.get("tasks", []) if t["state"] == "FAILED"]
            if failed:
                raise RuntimeError(f"JDBC sink task failed: {failed[0].get('trace', '')[:3000]}")
            committed = {tp.partition: tp.offset for tp in group.committed(wanted, timeout=10)}
            if all(committed.get(p, -1) >= end for p, end in ends.items()):
                caught_up_s = caught_up_s or elapsed
                differing = differing_rows(settings.pg_dsn, source, table)
                if differing == 0:
                    return time.perf_counter() - started, {"caught_up_s": round(caught_up_s, 2)}
                if elapsed - caught_up_s > 60:
                    raise RuntimeError(
                        f"JDBC sink at the end of the topic for 60 s, its table still {differing} rows off"
                    )
            time.sleep(0.5)
    finally:
        group.close()
        request("DELETE", f"/connectors/{name}")


# --- the run --------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> CdcResult:
    import psycopg

    settings = Settings.from_env()
    ensure_jdbc_sink()
    load_before = os.getloadavg()
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    runs: list[SystemRun] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-cdc-") as tmp,
        captured_table(settings, args.partitions) as (
            source,
            connector,
        ),
    ):
        workdir = Path(tmp)
        topic = connector.topic(source)
        started = time.perf_counter()
        inserts, updates, deletes = make_changes(settings.pg_dsn, source, args.changes)
        changes = inserts + updates + deletes
        records = changes + deletes  # each delete is followed by its tombstone
        wait_for_records(settings, topic, records, timeout_s=args.timeout)
        capture_s = time.perf_counter() - started
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            row = conn.execute(f"SELECT count(*) FROM {source}").fetchone()
        rows_at_end = int(row[0]) if row else 0
        size = record_bytes(settings, topic)
        print(
            f"[bench.cdc] {changes} changes ({records} records) in Kafka after {capture_s:.1f}s",
            file=sys.stderr,
        )

        mirrors = [f"{source}_onceflow", f"{source}_jdbc"]

        def onceflow() -> SystemRun:
            seconds, steps = run_onceflow(
                settings, topic, "postgres_changes", mirrors[0], args.epoch_records, workdir
            )
            diff = differing_rows(settings.pg_dsn, source, mirrors[0])
            print(f"[bench.cdc] onceflow: {seconds:.1f}s, {diff} differing rows", file=sys.stderr)
            name = "onceflow postgres_changes (exactly once)"
            return SystemRun(name, seconds, changes / seconds, diff == 0, steps)

        def jdbc() -> SystemRun:
            seconds, detail = run_jdbc_sink(
                settings, topic, source, mirrors[1], args.jdbc_tasks, args.jdbc_batch, args.timeout
            )
            print(f"[bench.cdc] JDBC sink: {seconds:.1f}s", file=sys.stderr)
            name = "Debezium JDBC sink (upsert, at least once)"
            return SystemRun(name, seconds, changes / seconds, True, detail)

        try:
            for system in (jdbc, onceflow) if args.jdbc_first else (onceflow, jdbc):
                runs.append(system())
            if args.iceberg:
                runs.append(run_iceberg(settings, topic, source, args.epoch_records, workdir, changes))
        finally:
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                for mirror in mirrors:
                    conn.execute(f"DROP TABLE IF EXISTS {mirror}")
                    conn.execute(f"DROP TABLE IF EXISTS {mirror}_onceflow_changes")
    result = CdcResult(
        changes,
        inserts,
        updates,
        deletes,
        records,
        args.partitions,
        capture_s,
        rows_at_end,
        runs,
        load_before,
        os.getloadavg(),
        "python -m bench.cdc " + " ".join(sys.argv[1:]),
        when,
        settings.spark_remote.split(";")[0] if settings.spark_remote else "spark-submit",
        {"epoch_records": args.epoch_records, "jdbc_tasks": args.jdbc_tasks, "jdbc_batch": args.jdbc_batch},
        size,
    )
    bad = [r.system for r in runs if not r.matches]
    if bad:
        raise SystemExit(f"[bench.cdc] mirror differs from the source table: {bad}")
    return result


def run_iceberg(
    settings: Settings, topic: str, source: str, epoch_records: int, workdir: Path, changes: int
) -> SystemRun:
    from onceflow.sinks.iceberg import default_catalog_properties

    table = f"bench.cdc_{uuid.uuid4().hex[:8]}"
    seconds, steps = run_onceflow(settings, topic, "iceberg_changes", table, epoch_records, workdir)
    diff = iceberg_differing_rows(
        settings.pg_dsn, source, default_catalog_properties(workdir / "iceberg"), table
    )
    print(f"[bench.cdc] onceflow iceberg: {seconds:.1f}s, {diff} differing rows", file=sys.stderr)
    return SystemRun("onceflow iceberg_changes (exactly once)", seconds, changes / seconds, diff == 0, steps)


# --- the report -----------------------------------------------------------------------------------------


def render(result: CdcResult) -> str:
    """The report's CDC section, between its markers."""
    ours = next(r for r in result.runs if "postgres_changes" in r.system)
    peer = next(r for r in result.runs if "JDBC" in r.system)
    ratio = ours.changes_per_s / peer.changes_per_s
    verdict = "met" if ratio >= TARGET_RATIO else "MISSED"
    options = {**DEFAULT_OPTIONS, **result.options}
    cores = os.cpu_count() or 1
    lines = [
        BEGIN,
        "## Change data capture (changes applied per second)",
        "",
        f"Measured by `{result.command}` on {result.when} (load average {_load(result.load_before)} before, "
        f"{_load(result.load_after)} after, {cores} cores; onceflow's runtime {result.runtime}). One run.",
    ]
    if result.load_before[0] > cores:
        lines += [
            "",
            f"**Measured on a shared machine** (1-minute load average {result.load_before[0]:.1f} on {cores} "
            "cores when it started, from other workloads): the seconds are pessimistic and noisy; the "
            "ratio, both systems on the same topic in the same run, less so.",
        ]
    lines += [
        "",
        f"{result.changes:,} changes ({result.inserts:,} inserts, {result.updates:,} updates, "
        f"{result.deletes:,} deletes of random live rows, in {ROUNDS} transactions) captured by Debezium's "
        f"PostgreSQL connector as JSON with schemas: {result.records:,} records (each delete adds a "
        f"tombstone) in {result.partitions} partitions, in Kafka {result.capture_s:.1f} s after the first "
        f"change; {result.rows_at_end:,} rows at the end. Then, on that topic, one system after the other "
        "(in the table's order), each into a table of its own:",
        "",
        "| system | seconds | changes/s | × JDBC sink | mirror equals the source | where the time went |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in result.runs:
        lines.append(
            f"| {r.system} | {r.seconds:.1f} | {r.changes_per_s:,.0f} | "
            f"{r.changes_per_s / peer.changes_per_s:.2f} | {'yes' if r.matches else 'NO'} | {_where(r)} |"
        )
    lines += [
        "",
        f"**Target: onceflow's PostgreSQL mirror (exactly once) ≥ {TARGET_RATIO}× Debezium's JDBC sink: "
        f"{ratio:.2f}×, {verdict}.**",
        "",
        "- **onceflow**: `onceflow run --until-caught-up` on the stack's Spark runtime, epochs of up to "
        f"{options['epoch_records']:,} offsets per partition, read tasks of {TASK_RECORDS:,}; timed from "
        "the command's start to its end (the Python start, the ledger and the plan included). Its tasks "
        "stage the changes in prepared transactions (COPY); the commit commits them and applies the "
        "epoch's changes per key (the last in source order wins) in one transaction, so the mirror moves "
        "from one epoch to the next and a replayed epoch changes nothing. Most of its time is the process "
        "step: change events are read and decoded in Python in the Spark tasks (the JVM read path does "
        "not take them).",
        "- **Debezium's JDBC sink connector** `io.debezium:debezium-connector-jdbc` 3.6.0.Final, the newest "
        "Maven Central serves (the rest of Debezium here is 3.6.1.Final), on the stack's Kafka Connect "
        "worker (one worker, 512 MB heap): `insert.mode=upsert`, `delete.enabled=true`, "
        f"`primary.key.mode=record_key`, `tasks.max={options['jdbc_tasks']}`, "
        f"`batch.size={options['jdbc_batch']}`, `use.reduction.buffer=true` (a batch keeps the last change "
        "of each key), the table made beforehand; timed from its registration until its consumer group's "
        "committed offsets reach the end of the topic and its table equals the source. It is at least once: "
        "a task restarted after a write and before its offsets are committed writes again, and readers "
        "see each batch as it lands.",
        "- The JSON with schemas carries each record's schema beside its values: "
        f"{result.record_bytes:,} bytes per record on average here (key and value, over the first 2,000 "
        "records of a partition, inserts; an update carries the old row too), most of what both systems "
        "read and parse.",
    ]
    if any("iceberg" in r.system for r in result.runs):
        lines.append(
            "- **onceflow into Iceberg** (`iceberg_changes`, a warehouse in a scratch folder with a SQLite "
            "catalog), timed like the PostgreSQL pipeline and compared with the source through pyiceberg. "
            "The table started empty, so its copy-on-write commit had no earlier data files to rewrite; "
            "epochs into a table that already holds the keys they change cost more."
        )
    lines.append(END)
    return "\n".join(lines) + "\n"


def _load(load: tuple[float, ...] | list[float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def _where(run: SystemRun) -> str:
    detail = run.detail
    if "epochs" in detail:
        return (
            f"{detail['epochs']} epoch(s): plan {detail['plan_s']:.1f} s, "
            f"process {detail['process_s']:.1f} s (read, decode, stage), "
            f"commit {detail['commit_s']:.1f} s (apply)"
        )
    if "caught_up_s" in detail:
        return f"at the end of the topic after {detail['caught_up_s']:.1f} s"
    return ""


def load_result(path: Path) -> CdcResult:
    """A result written with ``--json``, to render it again."""
    data = json.loads(path.read_text())
    data["runs"] = [SystemRun(**r) for r in data["runs"]]
    data["load_before"], data["load_after"] = tuple(data["load_before"]), tuple(data["load_after"])
    return CdcResult(**data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cdc", description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=lambda s: int(float(s)), default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--epoch-records",
        type=lambda s: int(float(s)),
        default=300_000,
        help="max_records_per_partition of onceflow's epochs",
    )
    parser.add_argument("--jdbc-tasks", type=int, default=4)
    parser.add_argument("--jdbc-batch", type=int, default=5000)
    parser.add_argument("--iceberg", action="store_true", help="the iceberg_changes pipeline too")
    parser.add_argument("--jdbc-first", action="store_true", help="the JDBC sink before onceflow")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--report", type=Path, help="write the section into this report")
    parser.add_argument("--json", type=Path, help="write the figures as JSON")
    parser.add_argument("--render", type=Path, help="measure nothing: render this --json file again")
    args = parser.parse_args(argv)
    result = load_result(args.render) if args.render else run(args)
    section = render(result)
    print(section)
    if args.json and not args.render:
        args.json.write_text(json.dumps(asdict(result), indent=2))
    if args.report:
        from bench.report import write_section

        write_section(args.report, section, BEGIN, END)


if __name__ == "__main__":
    main()
