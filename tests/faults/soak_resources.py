"""Resource hygiene of a soak: what a long run could leak, sampled between epochs; when a curve is bounded.

Samples are taken between two protocol steps, after every fault's recovery, so nothing may legitimately
be in flight: no prepared transaction of the soak's pipelines, no staged bytes, no open transaction of a
Kafka sink. The curves that may grow with the work done (ledger rows, file descriptors, connections)
are bounded when their peak in the run's second half is at most `GROWTH` times their peak in the first
half, plus a small absolute margin: a plateau or a sawtooth passes, any steady growth doubles and fails,
however long the run.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
from local_stack.footprint import FLAT_FACTOR, FLAT_MARGINS, Footprint, footprint, halves_growth
from local_stack.spark_runtime import SparkRuntime

from onceflow.sinks.kafka import transactional_id_prefix
from onceflow.sinks.staging import STAGING
from tests.faults.invariants import BucketTable

LEDGER_TABLES = ("pipelines", "epochs", "epoch_offsets", "participants", "dead_letters")
# Transaction states of Kafka's TransactionsCommand that hold a transaction open.
OPEN_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort"})
SINK_TRANSACTIONS = "onceflow:"  # the Kafka sink's transactional.id prefix (the workload's are "wl-")
GROWTH = FLAT_FACTOR
# Absolute margins over the first half's peak, per curve. A process's descriptors are split in two:
# files (log segments, jars, pipes), which a leak grows, and sockets, which come and go with the clients in
# flight. A broker at rest holds about 150 files and a dozen sockets; in the hour soaks its descriptors
# (then counted together) went from 172 up to 391 and back. Spark's pooled Kafka consumers (64 per executor,
# evicted after 5 idle minutes) fill in over the first minutes, so a short run's second half can hold more
# sockets than its first without anything leaking.
# The warm runtime's footprint (`local_stack.footprint`): JVM heaps settle after the first minutes and
# Connect sessions come and go with the epochs in flight. Its Python processes come and go too: a task's
# workers exit with it, and a session's daemon on an executor 30 s after its last task there. Whether a
# sample finds any depends on what the other pipelines run at that moment (the first half's peak of a
# short soak may be a sample with none), so their count is bounded at every sample instead: no more
# daemons than sessions held times executors. Memory is judged for growth without them, the JVMs'.
MARGINS = {
    "ledger_rows": 200,
    "fds": 64,
    "sockets": 256,
    "pg_connections": 5,
    "runtime_jvm_pss_mb": FLAT_MARGINS["total_mb"],
    "sessions": 3,
    # Offsets a pipeline has still to read: a fault holds a lane for up to a minute and a half, so a minute
    # and a half of input is the margin; a pipeline slower than the producer grows past it.
    "backlog": 90_000,
}


@dataclass
class Sample:
    minute: float
    prepared: int  # prepared transactions of the soak's pipelines (pg_prepared_xacts)
    staging_bytes: int  # bytes under every _staging folder of the soak, in its folder and its bucket
    kafka_open_sink: int  # open transactions of Kafka sinks
    kafka_open_workload: int  # open transactions of the producer (it keeps producing while sampling)
    ledger_rows: dict[str, int]
    pg_connections: int
    fds: dict[str, int]  # open file descriptors of each long-lived process, sockets left out
    rss_mb: dict[str, float]
    errors: list[str] = field(default_factory=list)
    # The warm runtime, when the soak runs on it: PSS in MB per role, Python processes, Connect sessions.
    runtime_pss_mb: dict[str, float] = field(default_factory=dict)
    python_processes: int = -1
    sessions: int = -1
    python_daemons: int = -1
    executors: int = -1
    backlog: dict[str, int] = field(default_factory=dict)  # per pipeline, set by the soak itself
    sockets: dict[str, int] = field(default_factory=dict)  # open sockets of each long-lived process

    @property
    def runtime_pss_total_mb(self) -> float:
        return round(sum(self.runtime_pss_mb.values()), 1) if self.runtime_pss_mb else float("nan")

    @property
    def runtime_jvm_pss_mb(self) -> float:
        """The runtime's PSS less its Python processes' (which come and go with tasks and sessions)."""
        return round(self.runtime_pss_total_mb - self.runtime_pss_mb.get("python", 0.0), 1)

    @property
    def ledger_total(self) -> int:
        return sum(self.ledger_rows.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "ledger_total": self.ledger_total,
            "runtime_pss_total_mb": self.runtime_pss_total_mb,
            "runtime_jvm_pss_mb": self.runtime_jvm_pss_mb,
        }


def _proc_fds(pid: int) -> tuple[int, int]:
    """A process's open descriptors as (files, sockets)."""
    files = sockets = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue  # closed between the listing and the look
        if target.startswith("socket:"):
            sockets += 1
        else:
            files += 1
    return files, sockets


def _proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _pidfile(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def stack_processes() -> dict[str, int]:
    """The long-lived processes of the stack: PostgreSQL's postmaster and the Kafka broker(s)."""
    home = Path(os.environ.get("ONCEFLOW_HOME", Path(__file__).resolve().parents[2] / ".onceflow"))
    found: dict[str, int] = {}
    postmaster = _pidfile(Path(os.environ.get("ONCEFLOW_PG_DATA", home / "postgres")) / "postmaster.pid")
    if postmaster:
        found["postgres"] = postmaster
    kafka_data = Path(os.environ.get("ONCEFLOW_KAFKA_DATA", home / "kafka"))
    if int(os.environ.get("ONCEFLOW_KAFKA_BROKERS", "1")) > 1:
        from tests.faults.kafka_cluster import KafkaCluster

        cluster = KafkaCluster()
        for node in cluster.nodes:
            if (pid := cluster.pid(node)) is not None:
                found[f"kafka-{node}"] = pid
    elif broker := _pidfile(kafka_data / "kafka.pid"):
        found["kafka"] = broker
    return found


def kafka_transactions(bootstrap: str) -> list[tuple[str, str]]:
    """(transactional.id, state) of every transaction the brokers know, by Kafka's own TransactionsCommand
    (the pinned confluent-kafka has no ListTransactions)."""
    repo = Path(__file__).resolve().parents[2]
    cache = Path(os.environ.get("ONCEFLOW_CACHE", repo / ".cache"))
    libs = cache / f"kafka-{os.environ.get('ONCEFLOW_KAFKA_VERSION', '4.1.1')}" / "libs"
    command = [
        "java",
        f"-Dlog4j2.configurationFile={repo / 'infra/kafka/log4j2-tools.yaml'}",
        "-cp",
        f"{libs}/*",
        "org.apache.kafka.tools.TransactionsCommand",
        "--bootstrap-server",
        bootstrap,
        "list",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"kafka transactions list exited {done.returncode}: {done.stderr[-300:]}")
    rows = [line.split() for line in done.stdout.splitlines()[1:] if line.strip()]
    return [(row[0], row[3]) for row in rows if len(row) >= 4]


@dataclass
class Sampler:
    """Takes one `Sample` of the soak's resources; every probe that fails is noted, never fatal."""

    root: Path
    pg_dsn: str
    ledger_dsn: str
    bootstrap: str
    pipelines: Sequence[str]
    extra_processes: Mapping[str, int] = field(default_factory=dict)
    processes: Callable[[], dict[str, int]] = stack_processes
    runtime: SparkRuntime | None = None
    buckets: Sequence[BucketTable] = ()  # files sinks in the bucket, whose staged markers count too

    def sample(self, minute: float) -> Sample:
        errors: list[str] = []
        prepared = connections = -1
        try:
            with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as pg:
                patterns = [f"onceflow:{name}:%" for name in self.pipelines]
                prepared = pg.execute(
                    "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE ANY(%s)", [patterns]
                ).fetchone()[0]  # type: ignore[index]
                connections = pg.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                ).fetchone()[0]  # type: ignore[index]
        except psycopg.Error as exc:
            errors.append(f"postgres: {exc}")
        ledger: dict[str, int] = {}
        try:
            with psycopg.connect(self.ledger_dsn, autocommit=True, connect_timeout=10) as db:
                for table in LEDGER_TABLES:
                    ledger[table] = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
        except psycopg.Error as exc:
            errors.append(f"ledger: {exc}")
        open_sink = open_workload = -1
        try:
            listed = [tid for tid, state in kafka_transactions(self.bootstrap) if state in OPEN_STATES]
            # Only the soak's own sinks: a test before it may leave another pipeline's transaction open.
            own = tuple(transactional_id_prefix(name) for name in self.pipelines)
            open_sink = sum(tid.startswith(own) for tid in listed)
            open_workload = sum(not tid.startswith(SINK_TRANSACTIONS) for tid in listed)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            errors.append(f"kafka transactions: {exc}")
        fds: dict[str, int] = {}
        sockets: dict[str, int] = {}
        rss: dict[str, float] = {}
        for name, pid in {**self.extra_processes, **self.processes()}.items():
            try:
                (fds[name], sockets[name]), rss[name] = _proc_fds(pid), _proc_rss_mb(pid)
            except OSError as exc:
                errors.append(f"{name} (pid {pid}): {exc.strerror}")
        staged = sum(p.stat().st_size for p in self.root.glob(f"**/{STAGING}/**/*") if p.is_file())
        for bucket in self.buckets:
            try:
                staged += bucket.staged_bytes()
            except OSError as exc:
                errors.append(f"bucket {bucket.root}: {exc}")
        spark = Footprint({}, -1, -1)
        if self.runtime is not None:
            try:
                spark = footprint(self.runtime)
            except (OSError, ValueError, psutil.Error) as exc:
                errors.append(f"spark runtime: {exc}")
        return Sample(
            round(minute, 2),
            prepared,
            staged,
            open_sink,
            open_workload,
            ledger,
            connections,
            fds,
            rss,
            errors,
            spark.pss_mb,
            spark.python_processes,
            spark.sessions,
            spark.python_daemons,
            spark.executors,
            sockets=sockets,
        )


# ------------------------------------------------------------------------------------- boundedness


def _halves(samples: Sequence[Sample]) -> tuple[Sequence[Sample], Sequence[Sample]]:
    middle = len(samples) // 2
    return samples[:middle], samples[middle:]


def curves(samples: Sequence[Sample]) -> dict[str, list[float]]:
    """Every sampled curve by name (ledger rows per table; files, sockets, RSS per process), in order."""
    found: dict[str, list[float]] = {
        "prepared": [s.prepared for s in samples],
        "staging_bytes": [s.staging_bytes for s in samples],
        "kafka_open_sink": [s.kafka_open_sink for s in samples],
        "kafka_open_workload": [s.kafka_open_workload for s in samples],
        "pg_connections": [s.pg_connections for s in samples],
        "ledger_rows": [s.ledger_total for s in samples],
        "runtime_pss_total_mb": [s.runtime_pss_total_mb for s in samples],
        "runtime_jvm_pss_mb": [s.runtime_jvm_pss_mb for s in samples],
        "python_processes": [
            s.python_processes if s.python_processes >= 0 else float("nan") for s in samples
        ],
        "python_daemons": [s.python_daemons if s.python_daemons >= 0 else float("nan") for s in samples],
        "sessions": [s.sessions if s.sessions >= 0 else float("nan") for s in samples],
    }
    for kind in ("ledger_rows", "fds", "sockets", "rss_mb", "runtime_pss_mb", "backlog"):
        names = sorted({n for s in samples for n in getattr(s, kind)})
        for name in names:
            found[f"{kind}.{name}"] = [getattr(s, kind).get(name, float("nan")) for s in samples]
    return found


def _known(count: int) -> float:
    """A count, or NaN (left out of every curve's bounds) where its probe could not tell (-1)."""
    return float(count) if count >= 0 else float("nan")


def slope_per_minute(samples: Sequence[Sample], values: Sequence[float]) -> float:
    """Least-squares slope over the samples (per minute of the run); 0 with fewer than two."""
    points = [(s.minute, v) for s, v in zip(samples, values, strict=True) if v == v]
    if len(points) < 2:
        return 0.0
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    spread = sum((x - mx) ** 2 for x, _ in points)
    return 0.0 if not spread else sum((x - mx) * (y - my) for x, y in points) / spread


def summary(samples: Sequence[Sample]) -> dict[str, dict[str, float]]:
    """min, max, first, last and the second half's slope of every curve, for the report."""
    _, second = _halves(samples)
    table = {}
    for name, values in curves(samples).items():
        seen = [v for v in values if v == v]
        if not seen:
            continue
        tail = values[len(samples) - len(second) :]
        table[name] = {
            "min": min(seen),
            "max": max(seen),
            "first": seen[0],
            "last": seen[-1],
            "second_half_slope_per_min": round(slope_per_minute(second, tail), 2),
        }
    return table


def unbounded(samples: Sequence[Sample]) -> list[str]:
    """What is not bounded, as the module says; empty when every curve is."""
    problems = []
    for s in samples:
        leaks = {
            "prepared transactions": s.prepared,
            "staged bytes": s.staging_bytes,
            "open Kafka sink transactions": s.kafka_open_sink,
        }
        problems += [f"minute {s.minute}: {n} {what}" for what, n in leaks.items() if n > 0]
        problems += [f"minute {s.minute}: probe failed: {e}" for e in s.errors]
        if (
            min(s.python_daemons, s.sessions, s.executors) >= 0
            and s.python_daemons > s.sessions * s.executors
        ):
            problems.append(
                f"minute {s.minute}: {s.python_daemons} Python daemons for {s.sessions} sessions on "
                f"{s.executors} executors"
            )
    first, second = _halves(samples)
    if len(first) < 2 or not second:
        return [*problems, f"{len(samples)} samples: too few to tell growth from a plateau"]
    for name, values in curves(samples).items():
        base = name.split(".")[0]
        if base not in MARGINS:
            continue
        growth = halves_growth(values, GROWTH, MARGINS[base])
        if growth is None:
            continue  # a process that only ran in one half (a broker restarted under a new name)
        if not growth.flat:
            problems.append(
                f"{name} grew: second-half peak {growth.second_half_peak:g} > {growth.limit:g} "
                f"(first-half peak {growth.first_half_peak:g})"
            )
    return problems
