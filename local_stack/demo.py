"""`make demo`: the orders example through Airflow, Spark, PostgreSQL and Kafka, with a crash on the way.

1. Fresh topics and tables for this demo run (so a second `make demo` works on the same stack), and
   ``<home>/examples.env`` naming them, so that `make airflow-ui` shows the same pipeline and data.
2. Produce a reproducible orders data set (with undecodable records and business-rule rejects).
3. Run the ``onceflow_orders`` DAG with ``airflow dags test``, one run per epoch, each bounded by the
   ``max_records_per_partition`` param, until the pipeline has no lag. The process tasks run on the
   warm Spark runtime when ``ONCEFLOW_SPARK_REMOTE`` is set (``make services`` sets it), through
   spark-submit otherwise. During the second run, the Spark driver is killed with SIGKILL mid-epoch (the
   Spark Connect server, restarted after the run; or the slice's spark-submit driver): that run's
   ``abort`` task rolls the epoch back, and the next run replays its range.
4. Check the sinks against the data set and print a report.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from local_stack.local_airflow import EXAMPLES_ENV, airflow_environment, migrate, run_airflow
from local_stack.spark_runtime import SparkRuntime
from onceflow import redact
from onceflow.config import Settings
from onceflow.errors import OnceflowError
from onceflow.ledger import Ledger

ORDERS = 1500
PARTITIONS = 3
MAX_RECORDS_PER_PARTITION = 200
KILLED_RUN = 2  # the demo run (1-based) whose slice 1 Spark driver gets SIGKILL
MAX_RUNS = 12


def _say(message: str) -> None:
    print(f"[onceflow demo] {message}", file=sys.stderr, flush=True)


def _create_topics(bootstrap: str, topics: Mapping[str, int]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [NewTopic(t, num_partitions=n) for t, n in topics.items()]  # replicas: the cluster default
    for topic, future in admin.create_topics(new).items():
        future.result(30)
        _say(f"created topic {topic}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = admin.list_topics(timeout=10).topics
        if all(t in listed and len(listed[t].partitions) == n for t, n in topics.items()):
            return
        time.sleep(0.2)


def _lag(settings: Settings, pipeline: str, topic: str) -> int:
    from onceflow.sources.kafka_metadata import KafkaMetadata

    with Ledger.connect(settings.ledger_url) as ledger:
        committed = ledger.committed_offsets(pipeline)
    with KafkaMetadata(settings.kafka_bootstrap) as metadata:
        parts = metadata.partitions([topic])
    return sum(p.stable - committed.get(p.key, 0) for p in parts)


def _kill_slice_driver(slice_number: int, stop: threading.Event) -> list[str]:
    """Wait for the Spark driver of one slice, let it run a few seconds, then SIGKILL it."""
    import psutil  # type: ignore[import-untyped]

    killed: list[str] = []

    def hunt() -> None:
        while not stop.is_set():
            for proc in psutil.process_iter(["pid", "cmdline"]):
                cmd = proc.info["cmdline"] or []
                if (
                    any(part.endswith("onceflow_process.py") for part in cmd)
                    and "--slice" in cmd
                    and cmd[cmd.index("--slice") + 1] == str(slice_number)
                    and "python" in Path(cmd[0]).name
                ):
                    time.sleep(6)  # mid-epoch: slice 0 has pre-committed, this slice is reading
                    with_epoch = cmd[cmd.index("--epoch") + 1]
                    try:
                        os.kill(proc.info["pid"], signal.SIGKILL)
                    except ProcessLookupError:
                        _say(f"the Spark driver of slice {slice_number} finished before it could be killed")
                        return
                    killed.append(f"epoch {with_epoch}, slice {slice_number}, pid {proc.info['pid']}")
                    _say(f"SIGKILL sent to the Spark driver of {killed[-1]}")
                    return
            time.sleep(0.5)

    thread = threading.Thread(target=hunt, daemon=True)
    thread.start()
    return killed


def _kill_connect_server(settings: Settings, pipeline: str, stop: threading.Event) -> list[str]:
    """Once the run's epoch is planned and the Spark Connect server runs one of its jobs (or 5 s after
    the plan, whichever comes first), SIGKILL the server: the slice's queries die with it."""
    killed: list[str] = []
    runtime = SparkRuntime.from_env()

    def hunt() -> None:
        planned_at = None
        while not stop.is_set():
            if planned_at is None:
                with Ledger.connect(settings.ledger_url) as ledger:
                    epoch = ledger.open_epoch(pipeline)
                if epoch is not None:
                    planned_at = time.monotonic()
            elif runtime.running_jobs() or time.monotonic() - planned_at > 5:
                pid = runtime.pid("connect")
                if pid is None:
                    _say("no pid file of the Spark Connect server: no fault in this run")
                    return
                os.kill(pid, signal.SIGKILL)
                killed.append(f"epoch {epoch.number} (the Spark Connect server, pid {pid})")
                _say(f"SIGKILL sent to the Spark Connect server mid-epoch {epoch.number} (pid {pid})")
                return
            time.sleep(0.1)

    threading.Thread(target=hunt, daemon=True).start()
    return killed


def _restart_spark_runtime() -> None:
    _say("restarting the Spark Connect server: infra/spark.sh start")
    SparkRuntime.from_env().start()


def _watch_epoch(settings: Settings, pipeline: str, label: str, stop: threading.Event) -> None:
    """Say every 15 s where the run's epoch stands, read from the ledger: a DAG run is quiet for minutes."""

    def watch() -> None:
        started = time.monotonic()
        while not stop.wait(15):
            try:
                with Ledger.connect(settings.ledger_url) as ledger:
                    epoch = ledger.open_epoch(pipeline)
                    reported = len(ledger.participants(pipeline, epoch.number)) if epoch else 0
            except Exception as exc:  # progress only: the run itself reports its failures
                _say(f"{label}: {time.monotonic() - started:.0f}s, ledger not readable now ({exc})")
                continue
            where = (
                f"epoch {epoch.number} {epoch.status}, {reported} participants pre-committed"
                if epoch
                else "no epoch in flight (recovering, planning, or finished)"
            )
            _say(f"{label}: {time.monotonic() - started:.0f}s, {where}")

    threading.Thread(target=watch, daemon=True).start()


def _read_topic(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    from onceflow.offsets import OffsetRange
    from onceflow.sources.kafka_metadata import KafkaMetadata
    from onceflow.sources.kafka_range import read_range

    with KafkaMetadata(bootstrap) as metadata:
        parts = metadata.partitions([topic])
    out = []
    for p in parts:
        for record in read_range(bootstrap, OffsetRange(topic, p.partition, 0, p.stable)):
            out.append(json.loads(record.value or b"{}"))
    return out


def _pg(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return list(conn.execute(sql).fetchall())


def _duplicates(ids: list[int]) -> int:
    return sum(n - 1 for n in Counter(ids).values() if n > 1)


def main() -> int:
    settings = Settings.from_env()
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    run = time.strftime("%Y%m%d%H%M%S")
    suffix = f"-demo{run}"
    os.environ["ONCEFLOW_ORDERS_SUFFIX"] = suffix
    from examples.orders import pipeline as orders
    from examples.orders.data import make_orders, produce

    began = time.monotonic()
    remote = settings.spark_remote
    runtime = (
        f"the warm Spark runtime (Spark Connect on {redact.url(remote)})"
        if remote
        else "spark-submit, one per slice"
    )
    _say(f"process tasks run on {runtime}")
    # 1.
    with Ledger.connect(settings.ledger_url, check=False) as ledger:
        ledger.upgrade()
    _say(f"ledger: {redact.url(settings.ledger_url)}")
    _create_topics(settings.kafka_bootstrap, {orders.INPUT_TOPIC: PARTITIONS, orders.ENRICHED_TOPIC: 1})
    (settings.home / EXAMPLES_ENV).write_text(f"ONCEFLOW_ORDERS_SUFFIX={suffix}\n")
    env = airflow_environment(settings, root, settings.home / "airflow")
    env["ONCEFLOW_ORDERS_SUFFIX"] = suffix
    _say(f"preparing Airflow in {settings.home / 'airflow'}")
    migrate(env)

    # 2.
    data = make_orders(0, ORDERS, bad_every=20)
    produce(settings.kafka_bootstrap, orders.INPUT_TOPIC, data.records)
    _say(
        f"produced {len(data.records)} orders to {orders.INPUT_TOPIC} ({PARTITIONS} partitions): "
        f"{len(data.valid)} valid, {len(data.rejected)} breaking a business rule, "
        f"{len(data.undecodable)} undecodable"
    )

    # 3.
    conf = json.dumps({"max_records_per_partition": MAX_RECORDS_PER_PARTITION})
    outcomes = []
    faults: list[str] = []
    for number in range(1, MAX_RUNS + 1):
        lag = _lag(settings, orders.NAME, orders.INPUT_TOPIC)
        if lag == 0:
            break
        stop = threading.Event()
        killed = []
        if number == KILLED_RUN:
            killed = (
                _kill_connect_server(settings, orders.NAME, stop) if remote else _kill_slice_driver(1, stop)
            )
        _say(f"run {number}: airflow dags test onceflow_orders ({lag} offsets to go)")
        _watch_epoch(settings, orders.NAME, f"run {number}", stop)
        started = time.monotonic()
        try:
            run_airflow(["dags", "test", "onceflow_orders", "--conf", conf], env, timeout=900)
        except OnceflowError as exc:
            _say(f"run {number}: airflow reported a failure: {str(exc).splitlines()[0]}")
        stop.set()
        faults += killed
        if killed and remote:
            _restart_spark_runtime()
        with Ledger.connect(settings.ledger_url) as ledger:
            last = ledger.epochs(orders.NAME, last=1)
        outcome = str(last[0].status) if last else "nothing planned"
        outcomes.append(outcome)
        note = f" after SIGKILL mid-{killed[0]}" if killed and remote else ""
        note = note or (f" after SIGKILL of the Spark driver of {killed[0]}" if killed else "")
        epoch = last[0].number if last else "-"
        _say(f"run {number}: epoch {epoch} {outcome} in {time.monotonic() - started:.0f}s{note}")

    # 4.
    dsn = os.environ.get("ONCEFLOW_ORDERS_PG_DSN") or settings.pg_dsn
    pg_ids = [int(r[0]) for r in _pg(dsn, f"SELECT order_id FROM {orders.ORDERS_TABLE}")]
    rejected = _pg(dsn, f"SELECT order_id, reason FROM {orders.REJECTED_TABLE}")
    kafka_ids = [int(v["order_id"]) for v in _read_topic(settings.kafka_bootstrap, orders.ENRICHED_TOPIC)]
    expected = set(data.valid)
    with Ledger.connect(settings.ledger_url) as ledger:
        letters = ledger.dead_letters(orders.NAME)
        epochs = ledger.epochs(orders.NAME)
        rows = []
        for e in epochs:
            parts = ledger.participants(orders.NAME, e.number)
            span = sum(r.span for r in e.ranges)
            written = sum(p.record_count for p in parts if p.sink == "orders_pg")
            what = "orders staged, rolled back" if e.abort_reason else "orders"
            reason = f" ({e.abort_reason[:60]}...)" if e.abort_reason else ""
            rows.append(f"    {e.number:>3}  {e.status!s:<10} {span:>6} offsets  {written:>5} {what}{reason}")
    reasons = Counter(d.letter.reason.split(":")[0] for d in letters)
    reasons.update(str(r[1]).split(":")[0] for r in rejected)
    missing = len(expected - set(pg_ids)) + len(expected - set(kafka_ids))
    duplicates = _duplicates(pg_ids) + _duplicates(kafka_ids)
    report = [
        "",
        "onceflow demo report",
        f"  pipeline              {orders.NAME} (DAG onceflow_orders, {len(outcomes)} runs: "
        f"{outcomes.count('COMMITTED')} epochs committed, {outcomes.count('ABORTED')} aborted and replayed)",
        f"  Spark runtime         {runtime}",
        (
            f"  fault injected        SIGKILL mid-{faults[0]}"
            if remote
            else f"  fault injected        SIGKILL of the Spark driver of {faults[0]}"
        )
        if faults
        else "  fault injected        none (the Spark driver finished before the kill)",
        f"  records in            {len(data.records)} on {orders.INPUT_TOPIC}",
        f"  out: PostgreSQL       {len(pg_ids)} rows in {orders.ORDERS_TABLE} (two-phase commit)",
        f"  out: Kafka            {len(kafka_ids)} records on {orders.ENRICHED_TOPIC} (transactions)",
        f"  out: rejected         {len(rejected)} rows in {orders.REJECTED_TABLE}",
        f"  dead letters          {len(letters)} in the ledger",
        "  reasons               " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())),
        f"  duplicates            {duplicates}",
        f"  missing               {missing}",
        f"  time                  {time.monotonic() - began:.0f}s",
        "  epochs",
        *rows,
        "",
        "Open the Airflow UI on the same DAG and data:  make airflow-ui   (airflow standalone; the login",
        "is printed by Airflow and stored in .onceflow/airflow/simple_auth_manager_passwords.json.generated)",
        f"The epochs from the command line:  onceflow epochs {orders.NAME}",
    ]
    print("\n".join(report))
    ok = (
        bool(faults)
        and "ABORTED" in outcomes
        and duplicates == 0
        and missing == 0
        and len(pg_ids) == len(expected)
        and len(rejected) == len(data.rejected)
        and len(letters) == len(data.undecodable)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
