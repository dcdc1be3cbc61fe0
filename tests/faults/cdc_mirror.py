"""A PostgreSQL table mirrored through Debezium, Kafka and the CDC pipeline, watched for the fault tests.

`CdcMirror` owns one source table (in a database of the test's), the Debezium connector that captures it
into a topic, and a `harness.Scenario` of `tests.faults.pipelines.cdc_pipeline` that reads that topic.
The source is changed only by `CdcMirror.change`, one row per transaction, and every change's table is
kept by its transaction id. So after any committed epoch the mirror can be compared, row for row, with
what it must be:

* the change events below the committed position, applied by key in topic order (what exactly-once
  means for a mirror: every committed change once, nothing else), read back from the topic itself;
* and the source table as of the last of those changes, whenever that prefix of the topic is the
  source's history (after a Kafka Connect crash Debezium re-sends changes from its last flushed offset,
  and until the re-sent ones catch up, the topic replays an older past: then only the first holds).

`CdcMirror.quiesce` writes one more change and waits for its event: Debezium streams in log order, so
everything the source did before, re-sent changes included, is in the topic then.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import random
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

from onceflow.config import Settings
from onceflow.ledger import Ledger
from onceflow.offsets import OffsetRange
from onceflow.sources.kafka_range import read_range
from tests import cdc
from tests.faults import harness

CDC = "tests.faults.pipelines:CDC"
COLUMNS = ("id", "name", "qty", "price", "updated_at")
KEYS = range(1, 9)
# A task that lost PostgreSQL retries after a second, not Debezium's default ten.
CONNECTOR_EXTRA = {"retriable.restart.connector.wait.ms": "1000"}

Rows = dict[int, tuple[Any, ...]]


def infra_process(service: str, *action: str) -> subprocess.Popen[str]:
    """``infra/<service>.sh ACTION`` started: the stack's own script, reading the stack from this
    process's environment (``stop --kill`` SIGKILLs the service; ``start`` starts what is not running).
    Kafka Connect starts with the options its killed worker had (`connect_options`)."""
    env = {**os.environ, **(connect_options() if service == "connect" else {})}
    return subprocess.Popen(
        [str(harness.REPO / "infra" / f"{service}.sh"), *action],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finished(process: subprocess.Popen[str]) -> None:
    """Wait for an `infra_process`; it must succeed."""
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, f"{process.args!r}: {err[-2000:]}"


def infra(service: str, *action: str) -> None:
    finished(infra_process(service, *action))


def connect_options() -> dict[str, str]:
    """The options the stack's Kafka Connect worker was started with, read back from the properties
    infra/connect.sh wrote for it (the optional plugins, ONCEFLOW_CONNECT_CONF's pairs), so that a
    restarted worker is the one that was killed."""
    data = os.environ.get("ONCEFLOW_CONNECT_DATA") or f"{os.environ.get('ONCEFLOW_HOME', '')}/connect"
    try:
        lines = (Path(data) / "connect-distributed.properties").read_text().splitlines()
    except OSError:
        return {}
    options = {}
    if any(line.startswith("plugin.path=") and "connect-plugins-optional" in line for line in lines):
        options["ONCEFLOW_CONNECT_JDBC_SINK"] = "1"
    if "# From ONCEFLOW_CONNECT_CONF." in lines:
        options["ONCEFLOW_CONNECT_CONF"] = " ".join(lines[lines.index("# From ONCEFLOW_CONNECT_CONF.") + 1 :])
    return options


def restart(service: str) -> None:
    """SIGKILL one of the stack's services and start it again, as an operator's supervisor would."""
    infra(service, "stop", "--kill")
    infra(service, "start")


# ------------------------------------------------------------------------------------ change events


@dataclass(frozen=True)
class Event:
    """One record of the change topic: a change (op, the row after it) or a tombstone (op None)."""

    offset: int
    key: int
    op: str | None
    row: tuple[Any, ...] | None
    tx: int | None = None
    lsn: int | None = None
    snapshot: str = "false"

    @property
    def streamed(self) -> bool:
        return self.op in ("c", "u", "d") and self.snapshot == "false"


def _field_value(schema: dict[str, Any], raw: Any) -> Any:
    """A row field as the JSON converter wrote it, typed as PostgreSQL returns the column."""
    if raw is None:
        return None
    if schema.get("name") == "org.apache.kafka.connect.data.Decimal":
        unscaled = int.from_bytes(base64.b64decode(raw), "big", signed=True)
        return Decimal(unscaled).scaleb(-int(schema["parameters"]["scale"]))
    if schema.get("name") == "io.debezium.time.ZonedTimestamp":
        return dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    return raw


def decode(offset: int, key: bytes | None, value: bytes | None) -> Event:
    """A record of Debezium's JSON converter with schemas (`tests.cdc.register_postgres_connector`)."""
    key_id = int(json.loads(key or b"null")["payload"]["id"])
    if value is None:
        return Event(offset, key_id, None, None)
    wrapped = json.loads(value)
    payload = wrapped["payload"]
    row = None
    if payload.get("after") is not None:
        after = next(f for f in wrapped["schema"]["fields"] if f["field"] == "after")
        types = {f["field"]: f for f in after["fields"]}
        row = tuple(_field_value(types[c], payload["after"][c]) for c in COLUMNS)
    source = payload["source"]
    return Event(
        offset, key_id, payload["op"], row, source.get("txId"), source.get("lsn"), str(source["snapshot"])
    )


def replay(events: list[Event]) -> Rows:
    """The events applied by key in topic order: a change's row replaces its key's, a delete or a
    tombstone removes it."""
    rows: Rows = {}
    for event in events:
        if event.row is not None:
            rows[event.key] = event.row
        else:
            rows.pop(event.key, None)
    return rows


# ------------------------------------------------------------------------------------------ mirror


@dataclass
class Check:
    """What one comparison after a committed epoch found."""

    position: int
    against_source: bool
    problems: list[str]


@dataclass
class CdcMirror:
    """Source table, connector and pipeline of one test (see the module's docstring)."""

    dsn: str
    table: str
    connector: cdc.CdcConnector
    scenario: harness.Scenario
    rng: random.Random
    events: list[Event] = field(default_factory=list)
    tables: dict[int | str, Rows] = field(default_factory=dict)  # the source after each transaction
    checks: list[Check] = field(default_factory=list)
    _next: int = 0

    @property
    def topic(self) -> str:
        return self.connector.topic(self.table)

    @property
    def mirror_table(self) -> str:
        return self.scenario.env["ONCEFLOW_FAULTS_TABLE"]

    # ---------------------------------------------------------------------------------- the source

    def source_rows(self, table: str | None = None) -> Rows:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            name = table or self.table
            if conn.execute("SELECT to_regclass(%s)", [name]).fetchone() == (None,):
                return {}
            found = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM {name}").fetchall()
        return {int(row[0]): tuple(row) for row in found}

    def _statement(self) -> tuple[str, list[Any]]:
        present = sorted(self.source_rows())
        absent = [k for k in KEYS if k not in present]
        roll = self.rng.random()
        if present and (roll < 0.55 or not absent):
            key, qty = self.rng.choice(present), self.rng.randint(0, 99)
            if self.rng.random() < 0.5:
                return f"UPDATE {self.table} SET qty = %s, price = %s WHERE id = %s", [qty, qty / 4, key]
            return f"UPDATE {self.table} SET qty = %s, updated_at = now() WHERE id = %s", [qty, key]
        if present and roll < 0.8:
            return f"DELETE FROM {self.table} WHERE id = %s", [self.rng.choice(present)]
        key = self.rng.choice(absent)
        return f"INSERT INTO {self.table} (id, name, qty) VALUES (%s, %s, %s)", [key, f"n{key}", None]

    def _run(self, statement: str, values: list[Any]) -> int:
        """One statement in a transaction of its own; the source's table after it is kept by its id."""
        with psycopg.connect(self.dsn, autocommit=True) as conn, conn.transaction():
            conn.execute(statement, values)
            row = conn.execute("SELECT txid_current() % 4294967296").fetchone()
        assert row is not None
        self.tables[int(row[0])] = self.source_rows()
        return int(row[0])

    def change(self, count: int) -> int:
        """``count`` changes, one transaction each: a key updated three times in a row, a key deleted
        and inserted again, then inserts, updates and deletes at random. Returns the last one's id."""
        present = sorted(self.source_rows())
        tx = 0
        if present and count >= 5:
            hot, gone = self.rng.choice(present), self.rng.choice(present)
            for qty in range(3):
                tx = self._run(f"UPDATE {self.table} SET qty = %s WHERE id = %s", [qty, hot])
            tx = self._run(f"DELETE FROM {self.table} WHERE id = %s", [gone])
            tx = self._run(f"INSERT INTO {self.table} (id, name, qty) VALUES (%s, 'again', 1)", [gone])
            count -= 5
        for _ in range(max(count, 0)):
            tx = self._run(*self._statement())
        return tx

    # ----------------------------------------------------------------------------------- the topic

    def read(self) -> None:
        """Read the change records the topic gained since the last call."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.scenario.settings.kafka_bootstrap,
                "group.id": "onceflow-faults-watermarks",
            }
        )
        try:
            listed = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            if listed is None or listed.error is not None or not listed.partitions:
                return  # the worker creates the topic with its first record
            _, end = consumer.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=10)
        finally:
            consumer.close()
        bootstrap = self.scenario.settings.kafka_bootstrap
        for record in read_range(bootstrap, OffsetRange(self.topic, 0, self._next, end)):
            self.events.append(decode(record.offset, record.key, record.value))
        self._next = max(self._next, end)

    def wait_for(self, tx: int, after: int = -1, timeout_s: float = 180) -> None:
        """Until the topic holds the change of transaction ``tx`` at an offset above ``after``."""
        deadline = time.monotonic() + timeout_s
        while not any(e.tx == tx and e.offset > after for e in self.events):
            if time.monotonic() > deadline:
                raise harness.HarnessError(f"{self.topic}: no change of transaction {tx} in {timeout_s} s")
            time.sleep(0.2)
            self.read()

    def quiesce(self) -> None:
        """One more change, then wait for its event: every earlier change (re-sent ones too) is in the
        topic before it."""
        self.read()
        self.wait_for(self.change(1), after=self._next - 1)

    def resends(self) -> int:
        """Change events the topic holds more than once (Debezium re-sent them after a crash)."""
        seen = [(e.tx, e.lsn, e.op, e.key) for e in self.events if e.streamed]
        return len(seen) - len(set(seen))

    # ------------------------------------------------------------------------------------- checking

    def position(self) -> int:
        with Ledger.connect(self.scenario.env["ONCEFLOW_LEDGER_URL"]) as ledger:
            return ledger.committed_offsets(self.scenario.spec.name).get((self.topic, 0), 0)

    def source_at(self, prefix: list[Event]) -> Rows | None:
        """The source table the events ``prefix`` stand for, if they are its history so far: the last
        change must be the newest one seen (no re-sent past replaying) and end a transaction of ours."""
        changes = [e for e in prefix if e.op is not None]
        if not changes:
            return None  # the topic's start: the source had its snapshot's rows already
        last = changes[-1]
        if last.op == "r":
            return self.tables["snapshot"] if last.snapshot == "last" else None
        newest = max((e.lsn or 0 for e in changes if e.streamed), default=0)
        return self.tables.get(last.tx) if last.streamed and last.tx and (last.lsn or 0) >= newest else None

    def check(self) -> Check:
        """The mirror after the committed epochs, compared with the committed change events and, where
        they are the source's history, with the source as of their last change."""
        self.read()
        position = self.position()
        prefix = [e for e in self.events if e.offset < position]
        mirror = self.source_rows(self.mirror_table)
        problems = []
        if position > self._next:
            problems.append(f"committed position {position} is past the topic's end {self._next}")
        if mirror != (applied := replay(prefix)):
            problems.append(f"at {position}: mirror {differences(mirror, applied)} the committed changes")
        source = self.source_at(prefix)
        if source is not None and mirror != source:
            problems.append(f"at {position}: mirror {differences(mirror, source)} the source")
        self.checks.append(Check(position, source is not None, problems))
        return self.checks[-1]

    # --------------------------------------------------------------------------------------- epochs

    def epoch(self, executor: str = "local") -> harness.StepOutcome:
        """One clean epoch, then the check; it must commit."""
        outcome = self.scenario.must(self.scenario.epoch(executor))
        self.check()
        return outcome

    def recover(self) -> harness.StepOutcome:
        """`recover` (retried while a restarted service still refuses), then the check."""
        for attempt in range(5):
            outcome = self.scenario.run("recover")
            if outcome.returncode == 0:
                self.check()
                return outcome
            time.sleep(1 + 2 * attempt)
        raise harness.HarnessError(f"recover failed: {outcome.output} {outcome.stderr}")

    def drain(self, limit: int = 20) -> None:
        """Epochs until the committed position is the topic's end (checked after each)."""
        self.read()
        for _ in range(limit):
            if self.position() >= self._next:
                return
            self.epoch()
        raise harness.HarnessError(f"{self.scenario.spec.name}: not caught up in {limit} epochs")

    def caught_up(self, pg: Any) -> list[str]:
        """After `quiesce` and `drain`: the mirror is the source, and the change log replays to it."""
        import pyarrow.parquet as pq

        from onceflow.sinks.files import committed_files

        source, mirror = self.source_rows(), self.source_rows(self.mirror_table)
        problems = [] if mirror == source else [f"caught up: mirror {differences(mirror, source)} the source"]
        # File by file: the executors do not write timestamps with one zone name (UTC, Etc/UTC), which
        # `read_committed_table` cannot merge.
        files = committed_files(self.scenario.root / "files" / "log")
        log = [row for path in files for row in pq.read_table(path).to_pylist()]
        replayed: Rows = {}
        for row in sorted(log, key=lambda r: (r["_partition"], r["_offset"])):
            if row["_op"] == "d":
                replayed.pop(row["id"], None)
            else:
                replayed[row["id"]] = tuple(row[c] for c in COLUMNS)
        if replayed != source:
            problems.append(f"caught up: change log replays to {differences(replayed, source)} the source")
        return problems + self.scenario.leftovers(pg)

    @property
    def problems(self) -> list[str]:
        return [p for c in self.checks for p in c.problems]


def differences(have: Rows, want: Rows) -> str:
    """How ``have`` differs from ``want``, in one line (keys missing, extra, different)."""
    missing = sorted(want.keys() - have.keys())
    extra = sorted(have.keys() - want.keys())
    changed = {k: (have[k], want[k]) for k in sorted(have.keys() & want.keys()) if have[k] != want[k]}
    return f"differs (missing {missing}, extra {extra}, changed {changed}) from"


# ------------------------------------------------------------------------------------------ set-up


def connect_ready(dsn: str) -> None:
    """Kafka Connect answers with Debezium's connector and the server decodes its log; unlike
    `tests.cdc.require_connect`, this removes no other connector (a stack's worker may be shared)."""
    plugins = {p["class"] for p in cdc.request("GET", "/connector-plugins")}
    assert cdc.POSTGRES_CONNECTOR in plugins, plugins
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",), "PostgreSQL needs wal_level=logical"


def wait_task_running(connector: cdc.CdcConnector, timeout_s: float = 180) -> None:
    """Until the connector's task runs again, restarting a task that failed (what an operator does
    after its database came back)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            tasks = connector.status().get("tasks", [])
        except (cdc.ConnectError, OSError):  # the worker is not back yet
            time.sleep(1)
            continue
        if tasks and all(t["state"] == "RUNNING" for t in tasks):
            return
        for task in tasks:
            if task["state"] == "FAILED":
                with contextlib.suppress(cdc.ConnectError):
                    cdc.request("POST", f"/connectors/{connector.name}/tasks/{task['id']}/restart")
        time.sleep(1)
    raise harness.HarnessError(f"connector {connector.name} not running after {timeout_s} s")


@contextlib.contextmanager
def cdc_mirror(dsn: str, root: Path, settings: Settings, seed: int, **env: str) -> Iterator[CdcMirror]:
    """A source table in database ``dsn`` (with two rows), its connector running and its snapshot in
    the topic, and the pipeline's scenario (its ledger under ``root``, its mirror in ``dsn``); the
    connector, its slot, the topic and the tables go afterwards."""
    connect_ready(dsn)
    with cdc.source_table(dsn, "cdc_faults", "2.50") as table:
        connector = cdc.register_postgres_connector(
            dsn, [f"public.{table}"], "json", extra=CONNECTOR_EXTRA, prefix="faults"
        )
        scenario = None
        try:
            scenario_env = {
                "ONCEFLOW_PG_DSN": dsn,
                "ONCEFLOW_FAULTS_TOPIC": connector.topic(table),
                "ONCEFLOW_FAULTS_TABLE": f"{table}_mirror",
                **env,
            }
            scenario = harness.Scenario(CDC, root, settings, partitions=1, env=scenario_env)
            mirror = CdcMirror(dsn, table, connector, scenario, random.Random(seed))
            mirror.tables["snapshot"] = mirror.source_rows()
            connector.wait_running(timeout_s=120)
            mirror.quiesce()
            yield mirror
        finally:
            connector.delete()
            with psycopg.connect(dsn, autocommit=True) as pg:
                if scenario is not None:
                    scenario.drop(pg)
                    pg.execute(
                        f"DROP TABLE IF EXISTS {scenario.env['ONCEFLOW_FAULTS_TABLE']}_onceflow_changes"
                    )
