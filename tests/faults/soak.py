"""The soak: every sink kind and keyed state under a steady load for a given time, a random fault about once a
minute, exactly-once checked from the outputs at the end, and the protocol's resources sampled throughout.

    python -m tests.faults.soak --minutes N [--seed S] [--rate R] [--out DIR]     (make soak MINUTES=60)

Three pipelines of the fault harness read one input topic that a producer thread feeds at ``--rate``
records a second (with an aborted transaction and a bad record now and then): the harness's records
pipeline (PostgreSQL two-phase commit, Parquet files, Iceberg, Delta, Kafka transactions), its table
pipeline (plain, idempotent upsert, write-ahead log, two-phase commit, Iceberg, Delta) and a keyed-state
pipeline (`tests.faults.soak_pipelines`). Their epochs run back to back, each protocol step in its own
driver process (`tests.faults.harness`). About once a minute the seed picks a fault from the catalogue: a
crash point of the protocol (SIGKILL of the coordinator, the driver or a task), the Kafka broker or
PostgreSQL SIGKILLed and restarted while an epoch is paused at a chosen step, and on a three-broker stack
(ONCEFLOW_KAFKA_BROKERS=3) the cluster faults of `tests.faults.kafka_cluster`. Kinds come in rounds
that hold each kind once, so any round covers the catalogue. A fault that does not land where it was
aimed (its crash point never reached, no task seen running) is a violation: the run did not test it.

The producer stops a little before the end and no fault starts in the last minute and a half, so the
last clean epochs drain the backlog. A producer transaction whose outcome is unknown (its commit timed
out) makes its records "maybe": the verdict settles them from the committed input topic, where each is
either found (then expected once in every sink) or not (then in none), never twice.

Every minute, between two steps, `tests.faults.soak_resources` samples prepared transactions, staged
bytes, open Kafka transactions, ledger rows, file descriptors and memory. The ledger is PostgreSQL (its
own database) with retention on: the commit step keeps the last `RETAIN_EPOCHS` committed epochs and
dead letters for `DEAD_LETTER_MINUTES`, which the soak reads every minute so that none goes unchecked.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from local_stack.spark_runtime import SparkRuntime

from onceflow.config import Settings
from onceflow.ledger import EpochStatus, Ledger
from onceflow.sources.kafka_metadata import KafkaMetadata
from onceflow.state import committed_state_files
from tests.faults import harness, invariants, soak_report, spark_faults
from tests.faults.kafka_output import read_committed
from tests.faults.soak_pipelines import KEYED_PATH, expected_sums
from tests.faults.soak_resources import (
    OPEN_STATES,
    SINK_TRANSACTIONS,
    Sample,
    Sampler,
    kafka_transactions,
    summary,
    unbounded,
)
from tests.faults.spark_faults import SPARK_KINDS
from tests.faults.test_restarts import restart
from tests.faults.workload import BAD_INPUT, Workload

RETAIN_EPOCHS = 2
RATE = 1000  # good records a second, by default: a load users run, not a trickle
# Records per read task: a few tasks per epoch at the soak's rate, as in production. Each task pays a
# fixed cost (a connection per sink, a Parquet writer, the Iceberg table's metadata), measured at about
# 0.6 s: tasks of 2,500 records spent more time there than on the records.
TASK_RECORDS = 10_000
DEAD_LETTER_MINUTES = 2.0  # longer than a sample interval: each dead letter is read before it goes
CATCH_UP = 5  # after a pause, a transaction makes up at most this many seconds of records
FAULT_EVERY_S = 60.0
SAMPLE_EVERY_S = 60.0
# The run's last stretch: no fault starts in the last FAULT_QUIET_S (one takes up to a minute and a half
# with its recovery), and the producer stops PRODUCE_QUIET_S before the end, so that the clean epochs of
# the last seconds drain the backlog and the catch-up after the run is one empty epoch per pipeline.
FAULT_QUIET_S = 90.0
PRODUCE_QUIET_S = 40.0
KINDS = ("crash", "kafka_restart", "postgres_restart")
CLUSTER_KINDS = ("cluster_leader", "cluster_coordinator", "cluster_zombie", "cluster_controller")
# Crash points inside Spark tasks: the warm runtime's executors do not inherit a driver step's
# environment, so there the tasks are hit by Spark's own kinds instead (`tests.faults.spark_faults`).
TASK_POINTS = ("task_mid_read", "task_after_stage", "task_after_precommit")
# Not a crash point: the fault lands as soon as Spark's REST API shows one of the epoch's tasks running.
MID_TASK = "mid_task"
# Where an epoch is, per lane, while a service restarts: reading, holding its pre-commits, deciding,
# publishing.
SERVICE_PAUSES = {
    "kafka_restart": {
        "records": (MID_TASK, "kafka.produced", "kafka.offsets_sent", "before_decision"),
        "table": (MID_TASK, "after_plan", "before_decision"),
        "keyed": (MID_TASK, "after_plan", "before_decision"),
    },
    "postgres_restart": {
        "records": ("slice_after_tasks", "after_decision", "participant_committed", "between_commits"),
        "table": ("slice_after_tasks", "wal.pushed", "participant_committed"),
        "keyed": ("before_decision", "after_decision"),
    },
}
KEYED_CRASHES = ("slice_after_precommits", "before_decision", "after_decision", "participant_committed")


# check_protocol_clean's line for two committed epochs of the ledger whose ranges do not meet.
CONTIGUITY = re.compile(r"epoch (\d+) starts \S+ at \d+, not at \d+$")


def retention_gaps(ledger_dsn: str, pipeline: str) -> set[int]:
    """Committed epochs whose predecessor in the ledger is not the epoch just before them: retention
    deleted the epochs between (it keeps an older one that a position or a snapshot needs), so their
    ranges cannot meet. Two committed epochs with nothing deleted between must still meet."""
    with Ledger.connect(ledger_dsn) as ledger:
        epochs = sorted(ledger.epochs(pipeline), key=lambda e: e.number)
    numbers = {e.number for e in epochs}
    gaps, previous = set(), None
    for epoch in epochs:
        if epoch.status is not EpochStatus.COMMITTED:
            continue
        if previous is not None and not numbers.issuperset(range(previous + 1, epoch.number)):
            gaps.add(epoch.number)
        previous = epoch.number
    return gaps


def without_retention_gaps(problems: list[str], gaps: set[int]) -> list[str]:
    return [p for p in problems if not ((m := CONTIGUITY.search(p)) and int(m.group(1)) in gaps)]


def say(line: str) -> None:
    print(f"[onceflow soak] {line}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- load


class SteadyProducer(threading.Thread):
    """``rate`` good records a second on average, one transaction each second; every tenth second or so a few
    records in an aborted transaction, and now and then a bad record. Kafka faults hold `paused`."""

    def __init__(self, workload: Workload, bootstrap: str, rate: int, seed: int) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.workload, self.bootstrap, self.rate = workload, bootstrap, rate
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.producing_s = 0.0  # from the first transaction to the stop: the rate it sustained is good / this
        self.offered = 0  # good records given to transactions so far (committed or not)
        self.done = threading.Event()
        self.transactions = 0
        self.errors: list[str] = []
        # Records of a transaction whose outcome the producer did not learn (a commit that timed out may
        # still have committed): good ids, and the reasons of bad records. `Soak.resolve_maybe` settles
        # them from the input topic.
        self.maybe_ids: set[int] = set()
        self.maybe_bad: list[str] = []

    def run(self) -> None:
        due = started = time.monotonic()
        while not self.done.is_set():
            aborted = 3 if self.rng.random() < 0.1 else 0
            bad = (self.rng.choice(sorted(BAD_INPUT)),) if self.rng.random() < 0.02 else ()
            with self.lock:
                # What the schedule owes: a Kafka fault holds the producer (`paused`) for up to a minute,
                # and the records of those seconds follow in larger transactions (at most CATCH_UP
                # seconds' worth each), so the run's average is the rate asked for.
                owed = int(self.rate * (time.monotonic() - started + 1.0)) - self.offered
                count = max(self.rate // 10, min(owed, CATCH_UP * self.rate))
                self.offered += count
                first = self.workload.next_id
                try:
                    self.workload.produce(self.bootstrap, count, aborted=aborted, bad=bad)
                    self.transactions += 1
                except Exception as exc:  # its records are "maybe": committed once or not at all
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    unknown = range(first, self.workload.next_id)
                    self.maybe_ids.update(i for i in unknown if i not in self.workload.good)
                    self.maybe_bad += bad
            due = max(due + 1.0, time.monotonic() - 1.0)
            self.done.wait(max(0.0, due - time.monotonic()))
        self.producing_s = time.monotonic() - started

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No transaction of the producer straddles a Kafka fault: its ids' fate stays known."""
        with self.lock:
            yield

    def stop(self) -> None:
        self.done.set()
        self.join(120)


# --------------------------------------------------------------------------------------------- lanes


@dataclass
class Lane:
    """One pipeline of the soak, with the executor its epochs run on and what happened to them."""

    name: str
    scenario: harness.Scenario
    executor: str
    committed: int = 0
    empty: int = 0
    failed: int = 0
    seconds: float = 0.0  # in clean epochs
    steps: Counter[str] = field(default_factory=Counter)  # seconds per step (plan, process, commit)
    offsets: int = 0  # read by the committed epochs

    def count(self, outcome: harness.StepOutcome) -> None:
        self.seconds += outcome.seconds
        self.steps.update(outcome.output.get("steps") or {})
        self.offsets += outcome.output.get("span") or 0
        if outcome.returncode != 0:
            self.failed += 1
        elif outcome.output.get("span"):
            self.committed += 1
        else:
            self.empty += 1


@dataclass
class SoakFault:
    number: int
    minute: float
    kind: str
    lane: str
    detail: str
    fired: bool
    exits: list[str]
    seconds: float
    leftovers: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fault_violations(faults: list[SoakFault]) -> list[str]:
    """What the soak's faults say against the run: a fault that did not land where it was aimed (so the
    run never tested what it scheduled) and what one left behind right after its recovery."""
    problems = [
        f"fault {f.number} ({f.kind} on {f.lane}: {f.detail}) did not land" for f in faults if not f.fired
    ]
    return problems + [f"fault {f.number} ({f.detail}): {p}" for f in faults for p in f.leftovers]


class Soak:
    def __init__(self, minutes: float, seed: int, rate: int, root: Path, settings: Settings) -> None:
        self.minutes, self.seed, self.rate, self.root, self.settings = minutes, seed, rate, root, settings
        self.rng = random.Random(seed)
        self.brokers = int(os.environ.get("ONCEFLOW_KAFKA_BROKERS", "1"))
        self.database = f"soak_{seed}_{uuid.uuid4().hex[:6]}"
        base, _, _ = settings.pg_dsn.rpartition("/")
        self.ledger_dsn = f"{base}/{self.database}"
        with psycopg.connect(settings.pg_dsn, autocommit=True) as pg:
            pg.execute(f'CREATE DATABASE "{self.database}"')
        common = {
            "ONCEFLOW_LEDGER_URL": self.ledger_dsn,
            "ONCEFLOW_RETAIN_EPOCHS": str(RETAIN_EPOCHS),
            "ONCEFLOW_FAULTS_TASK_RECORDS": str(TASK_RECORDS),
            "ONCEFLOW_DEAD_LETTER_DAYS": f"{DEAD_LETTER_MINUTES / 1440:.6f}",
        }
        if settings.spark_remote is None:
            raise SystemExit(
                "the soak runs every pipeline on the warm Spark runtime: set ONCEFLOW_SPARK_REMOTE "
                "(make soak starts the local stack with it)"
            )
        self.runtime = SparkRuntime.from_env()
        records = harness.Scenario(harness.RECORDS, root, settings, env=common)
        shared = {**common, "ONCEFLOW_FAULTS_TOPIC": records.env["ONCEFLOW_FAULTS_TOPIC"]}
        self.lanes = [
            Lane("records", records, "connect"),
            Lane("table", harness.Scenario(harness.TABLE, root, settings, env=shared), "connect"),
            Lane("keyed", harness.Scenario(KEYED_PATH, root, settings, env=shared), "connect"),
        ]
        self.workload = records.workload
        self.producer = SteadyProducer(self.workload, settings.kafka_bootstrap, rate, seed)
        self.sampler = Sampler(
            root,
            settings.pg_dsn,
            self.ledger_dsn,
            settings.kafka_bootstrap,
            [lane.scenario.spec.name for lane in self.lanes],
            extra_processes={"soak": os.getpid()},
            runtime=self.runtime,
            buckets=invariants.bucket_tables(records.spec),
        )
        self.samples: list[Sample] = []
        self.faults: list[SoakFault] = []
        self.letters: dict[str, dict[tuple[int, int], str]] = {lane.name: {} for lane in self.lanes}
        self.held: dict[str, set[tuple[int, int]]] = {lane.name: set() for lane in self.lanes}
        self.letter_problems: list[str] = []
        self.kinds: list[str] = []
        self.started = time.monotonic()
        self.maybe_committed = 0
        self.cluster: Any = None
        if self.brokers >= 3:
            from tests.faults.kafka_cluster import KafkaCluster

            self.cluster = KafkaCluster()

    # ----------------------------------------------------------------------------------------- steps

    def minute(self) -> float:
        return (time.monotonic() - self.started) / 60

    def settle(self, lane: Lane) -> None:
        """Recover the lane; a service that just restarted may refuse the first tries."""
        for attempt in range(6):
            if lane.scenario.run("recover").returncode == 0:
                return
            time.sleep(2 + 3 * attempt)
        lane.scenario.must(lane.scenario.run("recover"))

    def clean_epoch(self, lane: Lane) -> None:
        outcome = lane.scenario.epoch(lane.executor)
        lane.count(outcome)
        if outcome.returncode != 0:  # after a restart, the next epoch may fail; recovery rolls it back
            say(f"{lane.name}: epoch exited {outcome.returncode}: {str(outcome.output)[:200]}")
            self.settle(lane)

    def next_kind(self) -> str:
        if not self.kinds:
            kinds = [*KINDS, "crash", *SPARK_KINDS] + (
                list(CLUSTER_KINDS) if self.cluster is not None else []
            )
            self.kinds = self.rng.sample(kinds, len(kinds))
        return self.kinds.pop()

    def crash_fault(self, lane: Lane) -> tuple[str, bool, list[harness.StepOutcome]]:
        if lane.name == "records":
            name = self.rng.choice([n for n in harness.FAULT_NAMES if n not in TASK_POINTS])
            fault = harness.named_fault(name, self.rng.randint(0, harness.EPOCH_POINTS.get(name, 0)))
        elif lane.name == "table":
            crash = self.rng.choice([c for c in harness.TABLE_SCHEDULE if c.point not in TASK_POINTS])
            fault = harness.Fault(str(crash), (("epoch", crash),))
        else:
            point = self.rng.choice(KEYED_CRASHES)
            fault = harness.Fault(point, (("epoch", harness.Crash(point)),))
        steps = lane.scenario.inject(fault, lane.executor)
        crashes = [s for s in steps if s.crash is not None]
        return " then ".join(str(s.crash) for s in crashes), harness.fired(steps), steps

    def mid_task_fault(
        self, lane: Lane, act: Callable[[subprocess.Popen[str]], None], tries: int = 3
    ) -> tuple[bool, list[harness.StepOutcome]]:
        """An epoch whose Spark tasks run when ``act(its process)`` strikes. An epoch that ends before a
        task is seen was a clean one, and the next epoch tries again; the runtime is then brought back
        (what a supervisor of the Spark processes does) and the lane recovered."""
        outcomes, landed = [], False
        for _ in range(tries):
            running = lane.scenario.start("epoch", "--executor", lane.executor, pause=None)
            landed = spark_faults.wait_for_task(self.runtime, running.process)
            try:
                if landed:
                    act(running.process)
            finally:
                outcome = running.resume()
            outcomes.append(outcome)
            if landed:
                break
            lane.count(outcome)
        self.runtime.start()
        self.settle(lane)
        return landed, outcomes

    def paused_fault(self, lane: Lane, point: str, act: Any) -> tuple[bool, list[harness.StepOutcome]]:
        """An epoch paused at ``point`` while ``act()`` breaks a service; then the epoch goes on."""
        if point == MID_TASK:
            return self.mid_task_fault(lane, lambda _: act())
        running = lane.scenario.start("epoch", "--executor", lane.executor, pause=point)
        landed = True
        try:
            running.wait(timeout=300)
        except harness.HarnessError:  # nothing to read, or the step failed before the point
            landed = False
        try:
            act()
        except BaseException:  # the service did not come back: say so, not that the paused step hung
            running.process.kill()
            running.process.communicate(timeout=60)
            raise
        outcome = running.resume()
        self.settle(lane)
        return landed, [outcome]

    def service_fault(self, kind: str, lane: Lane) -> tuple[str, bool, list[harness.StepOutcome]]:
        point = self.rng.choice(SERVICE_PAUSES[kind][lane.name])
        service = "kafka" if kind == "kafka_restart" else "postgres"

        def act() -> None:
            with self.producer.paused() if service == "kafka" else contextlib.nullcontext():
                restart(service)
                if self.cluster is not None and service == "kafka":
                    self.cluster.wait_healthy(180)

        landed, steps = self.paused_fault(lane, point, act)
        return f"{service} SIGKILL+restart at {point}", landed, steps

    def cluster_fault(self, kind: str, lane: Lane) -> tuple[str, bool, list[harness.StepOutcome]]:
        """One fault of a three-broker cluster, landed while the records lane's epoch is paused."""
        cluster, spec = self.cluster, lane.scenario.spec
        topic = lane.scenario.env["ONCEFLOW_FAULTS_TOPIC"]
        partition = self.rng.randrange(lane.scenario.partitions)
        point, what = {
            "cluster_leader": (MID_TASK, f"leader of {topic}[{partition}] SIGKILLed mid-read"),
            "cluster_coordinator": ("kafka.produced", "the Kafka sink's transaction coordinator SIGKILLed"),
            "cluster_zombie": (MID_TASK, "a broker SIGSTOPped past the session timeout"),
            "cluster_controller": ("before_decision", "the active KRaft controller SIGKILLed"),
        }[kind]

        def act() -> None:
            with self.producer.paused():
                if kind == "cluster_leader":
                    node = cluster.leader(topic, partition)
                elif kind == "cluster_coordinator":
                    from onceflow.sinks.kafka import transactional_id

                    node = cluster.transaction_coordinator(transactional_id(spec.name, "kafka", 0))
                elif kind == "cluster_controller":
                    node = cluster.wait_controller()
                else:
                    node = self.rng.choice(cluster.nodes)
                    cluster.pause(node)
                    time.sleep(50)  # past the brokers' session timeout: the cluster fences it
                    cluster.resume(node)
                if kind != "cluster_zombie":
                    cluster.kill(node)
                    time.sleep(5)
                    cluster.start(node)
                cluster.wait_healthy(180)

        landed, steps = self.paused_fault(self.lane("records"), point, act)
        return f"{what} at {point}", landed, steps

    def spark_fault(self, kind: str, lane: Lane) -> tuple[str, bool, list[harness.StepOutcome]]:
        """One of Spark's own faults, landed while the epoch's tasks run (`tests.faults.spark_faults`)."""
        struck: list[str] = []
        landed, steps = self.mid_task_fault(
            lane, lambda step: struck.append(spark_faults.strike(kind, self.runtime, step))
        )
        what = struck[-1] if struck else "the epochs ended before a task was seen"
        return f"{spark_faults.DESCRIBED[kind]}: {what}", landed and "SIGKILLed" in what, steps

    def lane(self, name: str) -> Lane:
        return next(lane for lane in self.lanes if lane.name == name)

    def inject(self, number: int) -> None:
        kind = self.next_kind()
        lane = self.lane("records") if kind.startswith("cluster") else self.rng.choice(self.lanes)
        started, minute = time.monotonic(), self.minute()
        if kind == "crash":
            detail, fired, steps = self.crash_fault(lane)
        elif kind in SERVICE_PAUSES:
            detail, fired, steps = self.service_fault(kind, lane)
        elif kind in SPARK_KINDS:
            detail, fired, steps = self.spark_fault(kind, lane)
        else:
            detail, fired, steps = self.cluster_fault(kind, lane)
        with psycopg.connect(self.settings.pg_dsn, autocommit=True) as pg:
            gaps = retention_gaps(self.ledger_dsn, lane.scenario.spec.name)
            left = [
                f"right after recover: {p}" for p in without_retention_gaps(lane.scenario.leftovers(pg), gaps)
            ]
        fault = SoakFault(
            number,
            round(minute, 2),
            kind,
            lane.name,
            detail,
            fired,
            [f"{s.step}:{s.returncode}" for s in steps],
            round(time.monotonic() - started, 1),
            left,
        )
        self.faults.append(fault)
        say(
            f"fault {number} at minute {minute:.1f}: {kind} on {lane.name}: {detail}, "
            f"landed={fired} {left or 'ok'}"
        )

    # -------------------------------------------------------------------------------------- sampling

    def read_letters(self) -> None:
        """Remember every dead letter the ledger holds now (retention deletes old ones)."""
        with Ledger.connect(self.ledger_dsn) as ledger:
            for lane in self.lanes:
                stored = ledger.dead_letters(lane.scenario.spec.name)
                now: dict[tuple[int, int], str] = {}
                for d in stored:
                    position = (d.letter.partition, d.letter.offset)
                    if position in now:
                        self.letter_problems.append(f"{lane.name}: dead letter at {position} recorded twice")
                    now[position] = d.letter.code
                self.held[lane.name] = set(now)
                for position, code in now.items():
                    if self.letters[lane.name].setdefault(position, code) != code:
                        self.letter_problems.append(f"{lane.name}: dead letter at {position} changed reason")

    def backlogs(self) -> dict[str, int]:
        """Offsets each pipeline has still to read: the input's last stable offsets past its position."""
        topic = self.workload.topic
        with KafkaMetadata(self.settings.kafka_bootstrap) as metadata:
            ends = {p.partition: p.stable for p in metadata.partitions([topic])}
        with Ledger.connect(self.ledger_dsn) as ledger:
            found = {}
            for lane in self.lanes:
                position = ledger.committed_offsets(lane.scenario.spec.name)
                found[lane.name] = sum(end - position.get((topic, p), 0) for p, end in ends.items())
        return found

    def sample(self) -> None:
        self.read_letters()
        taken = self.sampler.sample(self.minute())
        try:
            taken.backlog = self.backlogs()
        except Exception as exc:  # a probe that fails is noted, never fatal
            taken.errors.append(f"backlog: {type(exc).__name__}: {exc}"[:300])
        self.samples.append(taken)
        say(
            f"minute {taken.minute}: prepared {taken.prepared}, staged {taken.staging_bytes} B, "
            f"open sink transactions {taken.kafka_open_sink}, ledger rows {taken.ledger_total}, "
            f"files {taken.fds}, sockets {taken.sockets}, "
            f"Spark runtime {taken.runtime_pss_total_mb:g} MB PSS with "
            f"{taken.python_processes} Python processes and {taken.sessions} sessions, "
            f"backlog {taken.backlog} {taken.errors or ''}"
        )

    # ------------------------------------------------------------------------------------------- run

    def run(self) -> None:
        records = self.lanes[0].scenario
        records.create_topics()
        self.producer.start()
        end = self.started + self.minutes * 60
        quiet = end - min(FAULT_QUIET_S, self.minutes * 60 / 4)
        stop_producing = end - min(PRODUCE_QUIET_S, self.minutes * 60 / 8)
        next_fault = self.started + self.rng.uniform(0.5, 1.0) * FAULT_EVERY_S
        next_sample = self.started
        turn = clean = 0
        while time.monotonic() < end:
            if time.monotonic() >= next_sample:
                self.sample()
                next_sample += SAMPLE_EVERY_S
            if self.producer.is_alive() and time.monotonic() >= stop_producing:
                self.producer.stop()
                say(f"minute {self.minute():.1f}: producer stopped; the last epochs drain the backlog")
            # Faults keep to a grid of about one a minute, with a round of clean epochs between two.
            if time.monotonic() >= next_fault and time.monotonic() < quiet and clean >= len(self.lanes):
                self.inject(len(self.faults) + 1)
                next_fault += self.rng.uniform(0.75, 1.25) * FAULT_EVERY_S
                clean = 0
                continue
            self.clean_epoch(self.lanes[turn % len(self.lanes)])
            turn, clean = turn + 1, clean + 1
        self.producer.stop()
        if self.producer.errors:
            self.wait_input_settled()
        say(f"{self.minutes:g} minutes done: catching every pipeline up")
        for lane in self.lanes:
            self.settle(lane)
            lane.scenario.catch_up(lane.executor)
        self.sample()

    # --------------------------------------------------------------------------------------- verdict

    def wait_input_settled(self, timeout_s: float = 180) -> None:
        """A transaction the producer gave up on stays open until the broker aborts it (the producer's
        transaction.timeout.ms) and holds the input's last stable offset back: catching up before it
        ends would stop short of the records after it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            listed = kafka_transactions(self.settings.kafka_bootstrap)
            if not [t for t, state in listed if state in OPEN_STATES and not t.startswith(SINK_TRANSACTIONS)]:
                return
            time.sleep(5)
        say(f"the producer's transactions are still open after {timeout_s:g} s; catching up all the same")

    def resolve_maybe(self) -> None:
        """Settle the records whose transaction had an unknown outcome from the committed input itself:
        found there, a good id is expected once in every sink and a bad record as a dead letter at its
        position; not found, nowhere. Either way never twice, which the tallies check."""
        self.maybe_committed = 0
        producer = self.producer
        if not producer.maybe_ids and not producer.maybe_bad:
            return
        bad_values = {value: reason for reason, (_, value) in BAD_INPUT.items()}
        maybe_bad = Counter(producer.maybe_bad)
        # The committed input as a plain read_committed consumer sees it, not as the pipelines read it.
        for record in read_committed(self.settings.kafka_bootstrap, self.workload.topic):
            position = (record.partition, record.offset)
            reason = bad_values.get(record.value or b"")
            if reason is not None:
                if position not in self.workload.bad and maybe_bad[reason] > 0:
                    maybe_bad[reason] -= 1
                    self.workload.bad[position] = reason
                    self.maybe_committed += 1
                continue
            record_id = json.loads(record.value or b"null")["id"]
            if record_id in producer.maybe_ids and record_id not in self.workload.good:
                self.workload.good[record_id] = position
                self.maybe_committed += 1

    def verdict(self) -> dict[str, invariants.Verdict]:
        self.resolve_maybe()
        expected = set(self.workload.good)
        found: dict[str, invariants.Verdict] = {}
        with psycopg.connect(self.settings.pg_dsn, autocommit=True) as pg:
            for lane in self.lanes:
                problems = []
                # Dead letters: every bad record was one, with its reason, at its position (read over the
                # run, since retention deletes the old ones); the ledger holds no other.
                seen = self.letters[lane.name]
                if seen != self.workload.bad:
                    problems.append(
                        f"dead letters seen {sorted(seen.items())} != "
                        f"bad input {sorted(self.workload.bad.items())}"
                    )
                held = {p: r for p, r in self.workload.bad.items() if p in self.held[lane.name]}
                if lane.name == "records":
                    view = dataclasses.replace(self.workload, bad=held)
                    with Ledger.connect(self.ledger_dsn) as ledger:
                        verdict = invariants.check_records(
                            lane.scenario.spec,
                            ledger,
                            pg,
                            lane.scenario.root,
                            view,
                            self.settings.kafka_bootstrap,
                        )
                elif lane.name == "table":
                    tallies = harness.observe_table(lane.scenario, pg, expected)
                    verdict = invariants.Verdict(list(tallies.values()))
                    for t in verdict.tallies:
                        at_least_once = t.sink in ("plain", "wal")
                        if t.lost or t.unexpected or (t.duplicates and not at_least_once):
                            verdict.violations.append(
                                f"sink {t.sink}: {t.lost} lost, {t.duplicates} duplicated, {t.unexpected} "
                                "that must not be there"
                            )
                    verdict.violations += lane.scenario.leftovers(pg)
                else:
                    verdict = invariants.Verdict(violations=self.keyed_problems(lane, pg))
                verdict.violations += problems
                gaps = retention_gaps(self.ledger_dsn, lane.scenario.spec.name)
                verdict.violations = without_retention_gaps(verdict.violations, gaps)
                found[lane.name] = verdict
        return found

    def keyed_problems(self, lane: Lane, pg: Any) -> list[str]:
        want = expected_sums(self.workload.good)
        table = lane.scenario.spec.sinks[0].config["table"]
        sums = dict(pg.execute(f"SELECT parity, total FROM {table}").fetchall())
        files = committed_state_files(lane.scenario.spec, Settings.from_env(lane.scenario.env))
        import pyarrow.parquet as pq

        snapshot = {r["parity"]: r["total"] for f in files for r in pq.read_table(f).to_pylist()}
        problems = lane.scenario.leftovers(pg)
        if sums != want:
            problems.append(f"keyed sums in PostgreSQL {sums} != {want} (each good id once)")
        if snapshot != want:
            problems.append(f"keyed state snapshot {snapshot} != {want}")
        return problems

    def drop(self) -> None:
        with psycopg.connect(self.settings.pg_dsn, autocommit=True) as pg:
            for lane in self.lanes:
                lane.scenario.drop(pg)
            pg.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')

    # ---------------------------------------------------------------------------------------- report

    def report(self, verdicts: dict[str, invariants.Verdict], error: str | None) -> dict[str, Any]:
        violations = [f"{lane}: {v}" for lane, verdict in verdicts.items() for v in verdict.violations]
        violations += fault_violations(self.faults)
        violations += self.letter_problems
        tallies = [t for verdict in verdicts.values() for t in verdict.tallies]
        return {
            "seed": self.seed,
            "minutes": self.minutes,
            "rate_per_s": self.rate,
            # What the producer sustained: good records over the seconds it produced.
            "sustained_per_s": round(len(self.workload.good) / max(1.0, self.producer.producing_s), 1),
            "brokers": self.brokers,
            "seconds": round(time.monotonic() - self.started, 1),
            "error": error,
            "records": {
                "good": len(self.workload.good),
                "aborted": len(self.workload.aborted),
                "bad": len(self.workload.bad),
                "producer_transactions": self.producer.transactions,
                "producer_errors": self.producer.errors,
                # Outcome unknown to the producer, settled from the committed input (`resolve_maybe`).
                "maybe": len(self.producer.maybe_ids) + len(self.producer.maybe_bad),
                "maybe_committed": self.maybe_committed,
            },
            "lanes": {
                lane.name: {
                    "pipeline": lane.scenario.spec.name,
                    "executor": lane.executor,
                    "sinks": {s.name: s.kind for s in lane.scenario.spec.sinks},
                    "keyed_state": lane.scenario.spec.state is not None,
                    "epochs_committed": lane.committed,
                    "epochs_empty": lane.empty,
                    "epochs_failed": lane.failed,
                    "clean_epoch_mean_s": round(
                        lane.seconds / max(1, lane.committed + lane.empty + lane.failed), 1
                    ),
                    # Where a clean epoch's time goes, and how fast it reads while it runs.
                    "clean_step_mean_s": {
                        step: round(seconds / max(1, lane.committed + lane.empty), 2)
                        for step, seconds in lane.steps.items()
                    },
                    "clean_offsets_per_s": round(lane.offsets / max(1.0, lane.seconds)),
                }
                for lane in self.lanes
            },
            "faults_per_kind": dict(Counter(f.kind for f in self.faults)),
            "faults_fired": sum(f.fired for f in self.faults),
            "faults": [f.to_dict() for f in self.faults],
            "verdict": {
                "lost": sum(t.lost for t in tallies),
                "duplicated_exactly_once": sum(
                    t.duplicates for t in tallies if t.sink not in ("plain", "wal")
                ),
                "duplicated_at_least_once": sum(t.duplicates for t in tallies if t.sink in ("plain", "wal")),
                "aborted_read": sum(t.unexpected for t in tallies),
                "lanes": {lane: verdict.to_dict() for lane, verdict in verdicts.items()},
                "violations": violations,
            },
            "resources": {
                "retain_epochs": RETAIN_EPOCHS,
                "dead_letter_minutes": DEAD_LETTER_MINUTES,
                "unbounded": unbounded(self.samples),
                "summary": summary(self.samples),
                "samples": [s.to_dict() for s in self.samples],
            },
            "not_wired": []
            if self.cluster is not None
            else ["cluster faults: the stack has one Kafka broker"],
        }


def run_soak(
    minutes: float, seed: int, rate: int, out: Path, root: Path | None = None
) -> tuple[dict[str, Any], Path]:
    """Run the soak and write ``soak-{seed}.json``, ``.md`` and ``.png`` under ``out``."""
    settings = Settings.from_env()
    root = root or Path(tempfile.mkdtemp(prefix="onceflow-soak-"))
    soak = Soak(minutes, seed, rate, root, settings)
    say(f"seed {seed}: {minutes:g} minutes at {rate} records/s, {soak.brokers} broker(s); folders in {root}")
    verdicts: dict[str, invariants.Verdict] = {}
    error = None
    try:
        soak.run()
        verdicts = soak.verdict()
    except Exception as exc:  # the report still says how far it got
        error = f"{type(exc).__name__}: {exc}"[:4000]
        soak.producer.stop()
        raise
    finally:
        data = soak.report(verdicts, error)
        path = soak_report.write(out, f"soak-{seed}", data)
        say(f"report: {path}")
        soak.drop()
    return data, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument(
        "--rate", type=int, default=RATE, help=f"good records produced per second (default {RATE})"
    )
    parser.add_argument("--out", type=Path, default=harness.REPO / "tests/faults/out")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    data, _ = run_soak(args.minutes, seed, args.rate, args.out)
    print(soak_report.markdown(data))
    failed = data["verdict"]["violations"] or data["resources"]["unbounded"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
