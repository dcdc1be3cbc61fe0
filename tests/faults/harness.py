"""The fault-injection harness: real pipelines, real services, real SIGKILLs, invariants from outputs.

A `Scenario` is one pipeline on fresh topics, tables and folders. Each step of the protocol runs in its
own process (`tests.faults.driver`), armed with at most one crash point, so a crash kills exactly what
a power cut would. After each fault the harness runs recovery, catches the pipeline up, and checks the
invariants (`tests.faults.invariants`).

Three ways to use it: the named fault matrix (every crash point once), a seeded random schedule of
faults (reproducible from its seed), and the consistency table of the seeds (sink kind x source kind,
observed under one fault schedule).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onceflow.config import Settings
from onceflow.faults import (
    CRASH_AT_ENV,
    CRASH_SKIP_ENV,
    CRASH_STATE_ENV,
    PAUSE_AT_ENV,
    PAUSE_DIR_ENV,
    crashed,
)
from onceflow.ledger import EpochStatus, Ledger, ParticipantStatus
from onceflow.pipeline import Pipeline, load_pipeline
from tests.faults import invariants
from tests.faults.pipelines import records_pipeline, table_pipeline
from tests.faults.socket_feed import SocketFeed
from tests.faults.workload import AVRO_BAD_INPUT, BAD_INPUT, Workload, avro_registry, avro_value

REPO = Path(__file__).resolve().parents[2]
RECORDS = "tests.faults.pipelines:RECORDS"
# The records pipeline's sinks, in the order its verdict tallies them.
RECORDS_SINKS = ("pg", "files", "files_s3", "iceberg", "delta", "kafka")
TABLE = "tests.faults.pipelines:TABLE"


@dataclass(frozen=True)
class Crash:
    """A crash point, and how many of its hits to let pass first (the timing of the fault)."""

    point: str
    skip: int = 0

    def __str__(self) -> str:
        return self.point if not self.skip else f"{self.point}+{self.skip}"


@dataclass(frozen=True)
class Fault:
    """A named fault: protocol steps run in order, each armed with at most one crash."""

    name: str
    steps: tuple[tuple[str, Crash | None], ...]


def _epoch_fault(point: str, skip: int = 0) -> Fault:
    return Fault(point, (("epoch", Crash(point, skip)),))


# Crash points that fire while one epoch runs, with the largest skip that still fires for the records
# pipeline (two slices, several tasks each, six sinks; the coordinator commits them in name order:
# delta, files, files_s3, iceberg, kafka, pg).
EPOCH_POINTS: dict[str, int] = {
    "after_plan": 0,
    "task_mid_read": 2,
    "task_after_stage": 5,
    "task_after_precommit": 5,
    "slice_after_tasks": 1,
    "slice_after_precommits": 1,
    "before_decision": 0,
    "after_decision": 0,
    "participant_committed": 5,
    "between_commits": 4,
    "before_complete": 0,
    "kafka.produced": 1,
    "kafka.offsets_sent": 1,
    "kafka.committed": 1,
}


def named_fault(name: str, skip: int = 0) -> Fault:
    """The fault called ``name``: an epoch crash point, or one of the two-crash sequences."""
    if name == "during_abort":  # the coordinator dies undecided; an operator's abort dies midway
        return Fault(name, (("epoch", Crash("before_decision")), ("abort", Crash("during_abort"))))
    if name == "during_recover":  # the coordinator dies decided; the first recovery dies midway
        return Fault(name, (("epoch", Crash("after_decision")), ("recover", Crash("during_recover"))))
    if name == "recovered_before_complete":  # recovery dies with every participant committed, not marked
        return Fault(name, (("epoch", Crash("after_decision")), ("recover", Crash("before_complete"))))
    return _epoch_fault(name, skip)


FAULT_NAMES: tuple[str, ...] = (*EPOCH_POINTS, "during_abort", "during_recover", "recovered_before_complete")


@dataclass
class StepOutcome:
    step: str
    crash: Crash | None
    returncode: int
    crashed: bool
    output: dict[str, Any]
    stderr: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "crash": str(self.crash) if self.crash else None,
            "returncode": self.returncode,
            "crashed": self.crashed,
            "output": self.output,
            "seconds": round(self.seconds, 2),
        }


@dataclass
class Paused:
    """A driver step running in the background, stopped at a pause point."""

    step: str
    point: str
    folder: Path
    process: subprocess.Popen[str]

    def wait(self, timeout: float = 120) -> None:
        """Until the step reached its pause point (it must not have finished before)."""
        deadline = time.monotonic() + timeout
        while not (self.folder / f"paused-{self.point}").exists():
            if self.process.poll() is not None:
                raise HarnessError(f"{self.step} ended before pausing at {self.point}: {self.process.stderr}")
            if time.monotonic() > deadline:
                raise HarnessError(f"{self.step} did not reach {self.point} in {timeout} s")
            time.sleep(0.05)

    def resume(self, timeout: float = 600) -> StepOutcome:
        if self.point:
            (self.folder / f"resume-{self.point}").touch()
        out, err = self.process.communicate(timeout=timeout)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        return StepOutcome(
            self.step,
            None,
            self.process.returncode,
            False,
            json.loads(lines[-1]) if lines else {},
            err[-4000:],
        )


class HarnessError(AssertionError):
    """The harness itself could not drive the scenario (a step failed that must not fail)."""


class Scenario:
    """One pipeline on fresh names; every protocol step runs in a child process."""

    def __init__(
        self,
        pipeline: str,
        root: Path,
        settings: Settings,
        *,
        partitions: int = 3,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.id = uuid.uuid4().hex[:8]
        self.pipeline = pipeline
        self.root = root / self.id
        self.root.mkdir(parents=True)
        self.settings = settings
        self.partitions = partitions
        self._crashes = 0
        base = {k: v for k, v in os.environ.items() if not k.startswith(("ONCEFLOW_CRASH", "ONCEFLOW_PAUSE"))}
        self.env: dict[str, str] = {
            **base,
            "ONCEFLOW_FAULTS_NAME": f"faults-{self.id}",
            "ONCEFLOW_FAULTS_TOPIC": f"faults-in-{self.id}",
            "ONCEFLOW_FAULTS_OUT_TOPIC": f"faults-out-{self.id}",
            "ONCEFLOW_FAULTS_TABLE": f"faults_{self.id}",
            "ONCEFLOW_FAULTS_ROOT": str(self.root),
            "ONCEFLOW_HOME": str(self.root / "home"),
            "ONCEFLOW_LEDGER_URL": f"sqlite:///{self.root / 'ledger.db'}",
            "ONCEFLOW_SPARK_MASTER": "local[2,3]",
            "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(REPO), *sys.path])),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            **(env or {}),
        }
        avro = self.env.get("ONCEFLOW_FAULTS_FORMAT") == "avro"
        if avro:  # the records pipeline on Avro records: their writer schema in a folder registry
            self.env["ONCEFLOW_SCHEMA_REGISTRY_URL"] = avro_registry(self.root / "schemas")
        self.spec: Pipeline = self._spec()
        with Ledger.connect(self.env["ONCEFLOW_LEDGER_URL"], check=False) as ledger:
            ledger.upgrade()
        self.workload = Workload(self.env["ONCEFLOW_FAULTS_TOPIC"], partitions)
        if avro:
            self.workload.encode, self.workload.bad_input = avro_value, AVRO_BAD_INPUT

    def _spec(self) -> Pipeline:
        """The scenario's spec as its child processes build it (under the scenario's environment)."""
        if self.pipeline in (RECORDS, TABLE):
            return (table_pipeline if self.pipeline == TABLE else records_pipeline)(self.env)
        module = self.pipeline.partition(":")[0]
        saved = os.environ.copy()
        try:
            os.environ.update(self.env)
            sys.modules.pop(module, None)
            return load_pipeline(self.pipeline)
        finally:
            os.environ.clear()
            os.environ.update(saved)
            sys.modules.pop(module, None)

    # ------------------------------------------------------------------------------------ resources

    def create_topics(self) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.settings.kafka_bootstrap})
        topics = [NewTopic(self.env["ONCEFLOW_FAULTS_TOPIC"], num_partitions=self.partitions)]
        if self.pipeline == RECORDS:
            topics.append(NewTopic(self.env["ONCEFLOW_FAULTS_OUT_TOPIC"], num_partitions=2))
        for future in admin.create_topics(topics).values():
            future.result(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # metadata reaches clients a moment after creation
            listed = admin.list_topics(timeout=10).topics
            if all(t.topic in listed and not listed[t.topic].error for t in topics):
                return
            time.sleep(0.2)
        raise HarnessError(f"topics {[t.topic for t in topics]} have no leaders after 30 s")

    def drop(self, pg: Any) -> None:
        """Delete the scenario's topics, tables and objects in the bucket (its folder stays, for
        post-mortems; the bucket is the stack's, which outlives the test run)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.settings.kafka_bootstrap})
        topics = [self.env["ONCEFLOW_FAULTS_TOPIC"], self.env["ONCEFLOW_FAULTS_OUT_TOPIC"]]
        for future in admin.delete_topics(topics).values():
            with contextlib.suppress(Exception):  # a topic the scenario never created
                future.result(30)
        for sink in self.spec.sinks:
            if "table" in sink.config and sink.kind != "files":
                pg.execute(f"DROP TABLE IF EXISTS {sink.config['table']}")
        with contextlib.suppress(Exception):  # a gateway a test left down: the prefixes are unique anyway
            invariants.drop_iceberg_warehouses(self.spec, self.root / "home")
        for table in invariants.bucket_tables(self.spec):
            with contextlib.suppress(Exception):
                table.delete()

    # ----------------------------------------------------------------------------------------- steps

    def run(self, step: str, crash: Crash | None = None, *extra: str) -> StepOutcome:
        """Run one driver step in a child process, armed with ``crash``."""
        env = dict(self.env)
        state = self.root / f"crash-{self._crashes}"
        if crash is not None:
            self._crashes += 1
            env.update(
                {CRASH_AT_ENV: crash.point, CRASH_STATE_ENV: str(state), CRASH_SKIP_ENV: str(crash.skip)}
            )
        command = [sys.executable, "-m", "tests.faults.driver", step, self.pipeline, *extra]
        started = time.monotonic()
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        return StepOutcome(
            step=step,
            crash=crash,
            returncode=done.returncode,
            crashed=crash is not None and crashed(state, crash.point),
            output=json.loads(lines[-1]) if lines else {},
            stderr=done.stderr[-4000:],
            seconds=time.monotonic() - started,
        )

    def start(self, step: str, *extra: str, pause: str | None) -> Paused:
        """Start a driver step in the background, to pause at ``pause`` until `Paused.resume` (with no
        pause, it runs through, and `Paused.resume` waits for its end)."""
        folder = self.root / f"pause-{uuid.uuid4().hex[:6]}"
        env = {**self.env, PAUSE_AT_ENV: pause, PAUSE_DIR_ENV: str(folder)} if pause else dict(self.env)
        command = [sys.executable, "-m", "tests.faults.driver", step, self.pipeline, *extra]
        process = subprocess.Popen(
            command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        return Paused(step, pause or "", folder, process)

    def epoch(self, executor: str, crash: Crash | None = None) -> StepOutcome:
        return self.run("epoch", crash, "--executor", executor)

    def must(self, outcome: StepOutcome) -> StepOutcome:
        if outcome.returncode != 0:
            raise HarnessError(
                f"{outcome.step} exited {outcome.returncode}: {outcome.output}\n{outcome.stderr}"
            )
        return outcome

    def inject(self, fault: Fault, executor: str) -> list[StepOutcome]:
        """Run the fault's steps, then the recovery that any restart begins with."""
        outcomes = []
        for step, crash in fault.steps:
            extra = ("--executor", executor) if step == "epoch" else ()
            outcomes.append(self.run(step, crash, *extra))
        outcomes.append(self.must(self.run("recover")))
        return outcomes

    def catch_up(self, executor: str, limit: int = 30) -> int:
        """Run clean epochs until one finds nothing left to read; returns how many ran."""
        for count in range(1, limit + 1):
            out = self.must(self.epoch(executor)).output
            if out.get("span") == 0:  # an epoch with nothing to read: no backlog either
                return count
        raise HarnessError(f"{self.spec.name} did not catch up in {limit} epochs")

    def epoch_status(self, number: int) -> EpochStatus:
        """What the ledger says of epoch ``number`` now."""
        with Ledger.connect(self.env["ONCEFLOW_LEDGER_URL"]) as ledger:
            found = ledger.epoch(self.spec.name, number)
        assert found is not None, f"epoch {number} of {self.spec.name} is not in the ledger"
        return found.status

    def sink_statuses(self, number: int) -> dict[str, set[ParticipantStatus]]:
        """Per sink, the statuses of epoch ``number``'s participants in the ledger."""
        found: dict[str, set[ParticipantStatus]] = {}
        with Ledger.connect(self.env["ONCEFLOW_LEDGER_URL"]) as ledger:
            for p in ledger.participants(self.spec.name, number):
                found.setdefault(p.sink, set()).add(p.status)
        return found

    def leftovers(self, pg: Any) -> list[str]:
        """What the protocol left behind: checked right after a fault's recovery, before catching up,
        whose own recover steps would otherwise hide a leak of the first one."""
        with Ledger.connect(self.env["ONCEFLOW_LEDGER_URL"]) as ledger:
            return invariants.check_protocol_clean(self.spec, ledger, pg, self.root)

    def verdict(self, pg: Any) -> invariants.Verdict:
        with Ledger.connect(self.env["ONCEFLOW_LEDGER_URL"]) as ledger:
            return invariants.check_records(
                self.spec, ledger, pg, self.root, self.workload, self.settings.kafka_bootstrap
            )


def spark_conf_with_kafka(folder: Path) -> Path:
    """A SPARK_CONF_DIR whose defaults put Spark's Kafka source (resolved by `infra/spark.sh jars`) on a
    spark-submit driver's classpath, so that its slices read on the JVM path."""
    cache = Path(os.environ.get("ONCEFLOW_CACHE") or REPO / ".cache")
    jars = sorted(cache.glob("spark-jars-*/jars/*.jar"))
    if not jars:
        raise HarnessError(f"no Spark Kafka source under {cache}: run `infra/spark.sh jars`")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spark-defaults.conf").write_text(f"spark.jars {','.join(str(j) for j in jars)}\n")
    return folder


# ---------------------------------------------------------------------------------------- fault runs


@dataclass
class FaultRecord:
    """One injected fault of a run, for the report."""

    number: int
    fault: str
    crash: str
    produced: int
    steps: list[StepOutcome]
    fired: bool
    verdict: invariants.Verdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "fault": self.fault,
            "crash": self.crash,
            "produced": self.produced,
            "fired": self.fired,
            "steps": [s.to_dict() for s in self.steps],
            **self.verdict.to_dict(),
        }


@dataclass
class FaultRun:
    seed: int | None
    executor: str
    records: list[FaultRecord] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def violations(self) -> list[str]:
        return [f"fault {r.number} ({r.crash}): {v}" for r in self.records for v in r.verdict.violations]

    @property
    def not_fired(self) -> list[str]:
        return [f"fault {r.number} ({r.crash})" for r in self.records if not r.fired]

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "executor": self.executor,
            "faults": len(self.records),
            "fired": sum(r.fired for r in self.records),
            "violations": self.violations,
            "seconds": round(self.seconds, 1),
            "records": [r.to_dict() for r in self.records],
        }


def fired(steps: Sequence[StepOutcome]) -> bool:
    """Whether a fault landed: it armed at least one crash, and every crash it armed happened."""
    crashes = [s for s in steps if s.crash is not None]
    return bool(crashes) and all(s.crashed for s in crashes)


def random_schedule(seed: int, count: int) -> list[tuple[Fault, int, int, tuple[str, ...]]]:
    """``count`` faults chosen from the seed: (fault, good records, aborted records, bad records).

    Faults come in rounds that each hold every named fault once, shuffled, so each round (17 faults)
    covers the whole protocol; within a round the seed picks the order, each crash's timing (how many hits
    of its point pass first) and the workload before it.
    """
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < count:
        names += rng.sample(FAULT_NAMES, len(FAULT_NAMES))
    schedule = []
    for name in names[:count]:
        skip = rng.randint(0, EPOCH_POINTS.get(name, 0))
        bad = tuple(rng.sample(sorted(BAD_INPUT), rng.randint(0, 2)))
        schedule.append((named_fault(name, skip), rng.randint(20, 60), rng.randint(0, 4), bad))
    return schedule


def run_faults(
    scenario: Scenario,
    pg: Any,
    faults: Sequence[tuple[Fault, int, int, tuple[str, ...]]],
    *,
    executor: str,
    seed: int | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> FaultRun:
    """Inject each fault in turn on one pipeline, recover, catch up and check every invariant."""
    run = FaultRun(seed, executor)
    started = time.monotonic()
    for number, (fault, good, aborted, bad) in enumerate(faults, 1):
        scenario.workload.produce(scenario.settings.kafka_bootstrap, good, aborted=aborted, bad=bad)
        steps = scenario.inject(fault, executor)
        after_recover = [f"right after recover: {problem}" for problem in scenario.leftovers(pg)]
        scenario.catch_up(executor)
        crashes = [s for s in steps if s.crash is not None]
        verdict = scenario.verdict(pg)
        verdict.violations += after_recover
        record = FaultRecord(
            number=number,
            fault=fault.name,
            crash=" then ".join(str(s.crash) for s in crashes),
            produced=good,
            steps=steps,
            fired=fired(steps),
            verdict=verdict,
        )
        run.records.append(record)
        status = (
            "ok" if not record.verdict.violations else "VIOLATED: " + "; ".join(record.verdict.violations)
        )
        progress(f"fault {number}/{len(faults)} {record.crash}: fired={record.fired} {status}")
    run.seconds = time.monotonic() - started
    return run


# ------------------------------------------------------------------------------- consistency table

SINK_ROWS = {
    "plain": "any sink (plain)",
    "idempotent": "idempotent sink",
    "wal": "write-ahead-log sink",
    "two_phase": "two-phase commit sink",
    "iceberg": "Iceberg sink (one snapshot per epoch)",
    "delta": "Delta sink (one commit per epoch)",
}
SOURCES = {"socket": "non-replayable source (socket)", "kafka": "replayable source (Kafka)"}
# The seeds' summary table, which the observed one must equal.
SEEDS_TABLE = {
    "plain": {"socket": "at-most-once", "kafka": "at-least-once"},
    "idempotent": {"socket": "at-most-once", "kafka": "exactly-once"},
    "wal": {"socket": "at-most-once", "kafka": "at-least-once"},
    "two_phase": {"socket": "at-most-once", "kafka": "exactly-once"},
    "iceberg": {"socket": "at-most-once", "kafka": "exactly-once"},
    "delta": {"socket": "at-most-once", "kafka": "exactly-once"},
}
# One fault schedule for every cell: one epoch per entry, each with its crash, then recovery. The sinks
# commit in name order (delta, iceberg, idempotent, plain, two_phase, wal): the coordinator dies with the
# first three committed.
TABLE_SCHEDULE: tuple[Crash, ...] = (
    Crash("task_mid_read"),
    Crash("task_after_stage", 3),
    Crash("before_decision"),
    Crash("wal.pushed"),
    Crash("participant_committed", 2),
    Crash("after_decision"),
    Crash("before_complete"),
)
TABLE_EPOCH = 30  # records per epoch


def observe_table(scenario: Scenario, pg: Any, expected: set[int]) -> dict[str, invariants.SinkTally]:
    home = scenario.root / "home"
    return {
        sink.name: invariants.tally(sink.name, expected, _table_ids(scenario, pg, sink.name, sink.kind, home))
        for sink in scenario.spec.sinks
    }


def _table_ids(scenario: Scenario, pg: Any, sink: str, kind: str, home: Path) -> list[int]:
    if kind == "iceberg":
        return invariants.iceberg_ids(scenario.spec, sink, home)
    if kind == "delta":
        return invariants.delta_ids(scenario.spec, sink)
    table = next(s for s in scenario.spec.sinks if s.name == sink).config["table"]
    return invariants.pg_ids(pg, table)


def table_column_kafka(scenario: Scenario, pg: Any, schedule: Sequence[Crash]) -> dict[str, Any]:
    scenario.create_topics()
    scenario.workload.produce(scenario.settings.kafka_bootstrap, TABLE_EPOCH * (len(schedule) + 1))
    fired = []
    for crash in schedule:
        outcome = scenario.epoch("local", crash)
        fired.append(outcome.crashed)
        scenario.must(scenario.run("recover"))
    scenario.catch_up("local")
    return {"tallies": observe_table(scenario, pg, set(scenario.workload.good)), "fired": fired}


def table_column_socket(scenario: Scenario, pg: Any, schedule: Sequence[Crash]) -> dict[str, Any]:
    records = [{"id": i, "payload": f"p{i}"} for i in range(TABLE_EPOCH * (len(schedule) + 1))]
    feed = SocketFeed(records)
    args = ("--feed", feed.address, "--count", str(TABLE_EPOCH))
    fired = []
    try:
        for crash in schedule:
            fired.append(scenario.run("socket-epoch", crash, *args).crashed)
            scenario.must(scenario.run("recover"))
        while feed.remaining:
            scenario.must(scenario.run("socket-epoch", None, *args))
    finally:
        feed.close()
    return {"tallies": observe_table(scenario, pg, {r["id"] for r in records}), "fired": fired}


def consistency_table(
    root: Path, settings: Settings, pg: Any, schedule: Sequence[Crash] = TABLE_SCHEDULE
) -> dict[str, Any]:
    """Every cell of the seeds' table, observed: {sink: {source: tally}}, plus which crashes fired."""
    columns: dict[str, dict[str, Any]] = {}
    for source, run_column in (("socket", table_column_socket), ("kafka", table_column_kafka)):
        env = {"ONCEFLOW_FAULTS_MAX_RECORDS": str(TABLE_EPOCH // 3)}
        scenario = Scenario(TABLE, root, settings, env=env)
        try:
            columns[source] = run_column(scenario, pg, schedule)
        finally:
            scenario.drop(pg)
    cells = {sink: {source: columns[source]["tallies"][sink] for source in SOURCES} for sink in SINK_ROWS}
    return {
        "schedule": [str(c) for c in schedule],
        "fired": {source: columns[source]["fired"] for source in SOURCES},
        "cells": cells,
    }


def observed_table(table: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    return {sink: {src: t.guarantee for src, t in row.items()} for sink, row in table["cells"].items()}


# ------------------------------------------------------------------------------------------ reports


def table_markdown(table: Mapping[str, Any]) -> str:
    lines = [
        f"| sink | {' | '.join(SOURCES.values())} |",
        "| --- | --- | --- |",
    ]
    for sink, row in table["cells"].items():
        cells = [
            f"{t.guarantee} (lost {t.lost}, duplicated {t.duplicates} of {t.expected})"
            for t in (row[source] for source in SOURCES)
        ]
        lines.append(f"| {SINK_ROWS[sink]} | {' | '.join(cells)} |")
    return "\n".join(lines)


def run_markdown(run: FaultRun) -> str:
    lines = [
        f"Seed {run.seed}, executor {run.executor}: {len(run.records)} faults, "
        f"{sum(r.fired for r in run.records)} fired, {len(run.violations)} violations, {run.seconds:.0f} s.",
        "",
        f"| # | fault | produced | exits | {' | '.join(RECORDS_SINKS)} | invariants |",
        f"| --- | --- | --- | --- | {' | '.join('---' for _ in RECORDS_SINKS)} | --- |",
    ]
    for r in run.records:
        exits = ", ".join(f"{s.step}:{s.returncode}" for s in r.steps)
        tallies = {t.sink: t for t in r.verdict.tallies}
        counts = [
            f"{tallies[s].delivered}/{tallies[s].expected}" if s in tallies else "-" for s in RECORDS_SINKS
        ]
        verdict = "ok" if not r.verdict.violations else "; ".join(r.verdict.violations)
        lines.append(
            f"| {r.number} | {r.crash} | {r.produced} | {exits} | {' | '.join(counts)} | {verdict} |"
        )
    return "\n".join(lines)


def write_report(out: Path, name: str, data: Mapping[str, Any], markdown: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    path = out / f"{name}.md"
    path.write_text(markdown + "\n")
    return path
