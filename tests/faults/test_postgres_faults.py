"""PostgreSQL faults: the server SIGKILLed inside `COMMIT PREPARED`, and a sink's server restarted while
participants are prepared. Each ends with recovery, catch-up and every invariant, read from the outputs.

Each scenario gets a fresh database on the stack's PostgreSQL, holding the PostgreSQL sink's table and
markers and, with ``ledger="postgres"``, the ledger too (the deployment on PostgreSQL: one server for
both); with ``ledger="sqlite"`` the ledger is a file and only the sink lives on the server. The kills and
restarts hit the whole server, through ``infra/postgres.sh`` with the environment of the stack the tests
run in, as `test_restarts` does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from onceflow.config import Settings
from onceflow.ledger import EpochStatus, Ledger
from onceflow.ledger.records import Epoch
from tests.faults import harness

pytestmark = [pytest.mark.integration, pytest.mark.faults]

INFRA = harness.REPO / "infra"
GOOD = 48
# Records per write task in the kill inside COMMIT PREPARED: 4 gives about 15 tasks, so the commit
# step runs that many COMMIT PREPARED statements in a row (the harness's default of 25 gives about 3).
TASK_RECORDS = 4
# The longest pause PostgreSQL allows before a WAL flush (commit_delay, in microseconds; see below).
COMMIT_DELAY_US = 100_000


# ------------------------------------------------------------------------------------- the server


def infra_postgres(*action: str) -> None:
    done = subprocess.run([str(INFRA / "postgres.sh"), *action], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def restart_postgres() -> None:
    """SIGKILL the server (postmaster and backends) and start it again, as the operator's script does."""
    infra_postgres("stop", "--kill")
    infra_postgres("start")


def superuser_dsn(dsn: str) -> str:
    """The local stack's superuser on the same database (the stack trusts loopback connections)."""
    return make_conninfo(dsn, user="postgres", password="")


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if parent_pid(int(entry.name)) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):  # a process that ended meanwhile
                continue
    return found


def sigkill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # a backend that exited meanwhile
            os.kill(pid, signal.SIGKILL)


def postmaster_of(admin: Any) -> int:
    """The pid of the server's postmaster, from its data folder's pid file; the server must run on this
    machine (the caller's backend is its child), or the test would SIGKILL someone else's process."""
    folder = admin.execute("SHOW data_directory").fetchone()[0]
    postmaster = int((Path(folder) / "postmaster.pid").read_text().split()[0])
    backend = admin.execute("SELECT pg_backend_pid()").fetchone()[0]
    assert parent_pid(backend) == postmaster, f"PostgreSQL at {folder} does not run on this machine"
    return int(postmaster)


def kill_inside_commit_prepared(
    dsn: str, postmaster: int, committed_first: int, timeout: float = 60
) -> tuple[str, list[str]]:
    """Watch ``pg_stat_activity`` and SIGKILL the server while a COMMIT PREPARED runs, once
    ``committed_first`` earlier ones have finished: the running statement's backend first, then the
    postmaster and every other backend. Returns the gid whose COMMIT PREPARED was running, and the gids
    seen running before it."""
    seen: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as watch:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = watch.execute(
                "SELECT pid, query FROM pg_stat_activity WHERE state = 'active'"
                " AND datname = current_database() AND starts_with(query, 'COMMIT PREPARED')"
            ).fetchall()
            for pid, query in rows:
                gid = query.split("'")[1]
                if gid not in seen:
                    seen.append(gid)
                if len(seen) > committed_first and parent_pid(pid) == postmaster:
                    sigkill([pid, postmaster, *children_of(postmaster)])
                    return gid, seen[:-1]
            time.sleep(0.002)
    raise AssertionError(f"no COMMIT PREPARED number {committed_first + 1} ran within {timeout} s: {seen}")


# ------------------------------------------------------------------------------------ the scenario


@pytest.fixture(autouse=True)
def stack_is_the_one_restarted(settings: Settings) -> None:
    """The server the tests kill (the DSN's) must be the one `infra/postgres.sh` starts again."""
    port = conninfo_to_dict(settings.pg_dsn).get("port")
    infra_port = os.environ.get("ONCEFLOW_PG_PORT", "15432")
    if str(port) != infra_port:
        pytest.fail(
            f"ONCEFLOW_PG_DSN names port {port} but infra/postgres.sh would restart port {infra_port}: "
            "load the stack's settings with ONCEFLOW_PG_PORT exported",
            pytrace=False,
        )


def make_scenario(
    ledger: str, dsn: str, tmp_path: Path, settings: Settings, task_records: int
) -> harness.Scenario:
    env = {
        "ONCEFLOW_PG_DSN": dsn,
        "ONCEFLOW_FAULTS_TASK_RECORDS": str(task_records),
        "ONCEFLOW_FAULTS_SLICES": "1",
    }
    if ledger == "postgres":
        env["ONCEFLOW_LEDGER_URL"] = dsn
    scenario = harness.Scenario(harness.RECORDS, tmp_path, settings, env=env)
    scenario.create_topics()
    scenario.workload.produce(settings.kafka_bootstrap, GOOD, aborted=3, bad=("malformed_json",))
    return scenario


@pytest.fixture
def scenario_of(tmp_path: Path, settings: Settings, pg_database: str) -> Iterator[Any]:
    """Makes the test's scenario on a fresh database (which `pg_database` drops afterwards)."""
    made: list[harness.Scenario] = []

    def make(ledger: str, task_records: int = 25) -> harness.Scenario:
        made.append(make_scenario(ledger, pg_database, tmp_path, settings, task_records))
        return made[-1]

    yield make
    with psycopg.connect(pg_database, autocommit=True) as fresh:  # PostgreSQL has restarted
        # A failed test may leave prepared transactions: their locks would keep the tables and the
        # database from being dropped, and they hold slots of max_prepared_transactions. Nothing else
        # uses this database.
        left = fresh.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
        for (gid,) in left.fetchall():
            fresh.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        for scenario in made:
            scenario.drop(fresh)


def in_flight(scenario: harness.Scenario) -> Epoch:
    with Ledger.connect(scenario.env["ONCEFLOW_LEDGER_URL"]) as ledger:
        epoch = ledger.open_epoch(scenario.spec.name)
    assert epoch is not None
    return epoch


def pg_participants(scenario: harness.Scenario, number: int) -> set[str]:
    """The gids of the PostgreSQL sink's participants the ledger accepted for the epoch."""
    with Ledger.connect(scenario.env["ONCEFLOW_LEDGER_URL"]) as ledger:
        return {
            str(p.committable.handle["gid"])
            for p in ledger.participants(scenario.spec.name, number)
            if p.sink == "pg"
        }


def prepared(pg: Any, scenario: harness.Scenario, number: int) -> set[str]:
    rows = pg.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
        [f"onceflow:{scenario.spec.name}:{number}:"],
    ).fetchall()
    return {gid for (gid,) in rows}


def committed_tasks(pg: Any, scenario: harness.Scenario, number: int) -> set[str]:
    """The PostgreSQL sink's tasks of the epoch whose marker row is committed (visible)."""
    rows = pg.execute(
        "SELECT task FROM onceflow_markers WHERE pipeline = %s AND epoch = %s AND sink = 'pg'",
        [scenario.spec.name, number],
    ).fetchall()
    return {task for (task,) in rows}


def task_of(gid: str) -> str:
    return gid.split(":")[5]


def finish(scenario: harness.Scenario, dsn: str) -> str:
    """Recover, check nothing is left in flight, prepared or staged, catch up, check every invariant."""
    recovered = scenario.must(scenario.run("recover")).output["recovered"]
    with psycopg.connect(dsn, autocommit=True) as pg:
        assert scenario.leftovers(pg) == []
        scenario.catch_up("local")
        verdict = scenario.verdict(pg)
    assert verdict.violations == []
    assert all(t.delivered == len(scenario.workload.good) for t in verdict.tallies)
    return str(recovered)


# ------------------------------------------------------------------------------------------ tests


def test_postgres_killed_inside_commit_prepared(scenario_of: Any, pg_database: str) -> None:
    """The server that holds the ledger and the sink dies while the commit step's COMMIT PREPARED of one
    participant runs; recovery commits the rest, and each participant's rows become visible once.

    How the kill lands inside the statement: while the epoch waits at ``after_decision`` (decided, nothing
    committed), the scenario's database gets ``commit_delay`` = 0.1 s with ``commit_siblings`` = 0, so
    each COMMIT PREPARED of the commit step sleeps 0.1 s inside the server after writing its commit record
    to the WAL buffers and before flushing it (PostgreSQL's group-commit delay, holding the WAL write lock).
    A watcher polls ``pg_stat_activity``; once two COMMIT PREPARED statements have come and gone and a
    third runs, it SIGKILLs that backend, the postmaster and every other backend itself, within a few
    milliseconds (`infra/postgres.sh stop --kill` then only tidies up). The landing is asserted
    from the restarted server: the running statement's transaction is still prepared (its commit record
    never reached the disk), the two before it are committed (their markers are visible), and every
    participant is exactly one of the two.
    """
    scenario = scenario_of("postgres", TASK_RECORDS)
    running = scenario.start("epoch", "--executor", "local", pause="after_decision")
    running.wait()
    epoch = in_flight(scenario)
    assert epoch.status is EpochStatus.COMMITTING
    gids = pg_participants(scenario, epoch.number)
    assert len(gids) >= 6, gids  # enough COMMIT PREPARED statements to die among
    with psycopg.connect(superuser_dsn(pg_database), autocommit=True) as admin:
        assert admin.execute("SHOW fsync").fetchone() == ("on",), "commit_delay only sleeps with fsync on"
        postmaster = postmaster_of(admin)
        name = admin.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        admin.execute(f'ALTER DATABASE "{name}" SET commit_delay = {COMMIT_DELAY_US}')
        admin.execute(f'ALTER DATABASE "{name}" SET commit_siblings = 0')
    (running.folder / f"resume-{running.point}").touch()
    try:
        killed_in, before = kill_inside_commit_prepared(pg_database, postmaster, committed_first=2)
        outcome = running.resume(timeout=120)
    finally:  # the next tests need the server, whatever happened here
        infra_postgres("stop", "--kill")  # the pid file goes; nothing of the old server is left running
        infra_postgres("start")
    assert outcome.returncode != 0, outcome.output  # the commit step lost its server mid-statement
    with psycopg.connect(superuser_dsn(pg_database), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" RESET commit_delay')
        admin.execute(f'ALTER DATABASE "{name}" RESET commit_siblings')
    with psycopg.connect(pg_database, autocommit=True) as pg:
        left = prepared(pg, scenario, epoch.number)
        done = committed_tasks(pg, scenario, epoch.number)
    assert killed_in in left, (killed_in, left)  # it died inside COMMIT PREPARED, before the flush
    assert {task_of(g) for g in before} <= done, (before, done)  # the earlier ones are durable
    assert {task_of(g) for g in gids} == done | {task_of(g) for g in left}  # each committed or prepared
    assert not done & {task_of(g) for g in left}
    assert scenario.epoch_status(epoch.number) is EpochStatus.COMMITTING  # the decision survived
    recovered = finish(scenario, pg_database)
    assert f"epoch {epoch.number} committed" in recovered, recovered
    assert scenario.epoch_status(epoch.number) is EpochStatus.COMMITTED


# The server that restarts holds the ledger too, or only the sink (the SQLite ledger is not touched).
RESTART_CASES = [
    pytest.param("postgres", True, id="postgres-decided"),
    pytest.param("postgres", False, id="postgres-undecided"),
    pytest.param("sqlite", False, id="sqlite-undecided"),
]


@pytest.mark.parametrize(("ledger", "decided"), RESTART_CASES)
def test_sink_postgres_restarted_while_participants_are_prepared(
    ledger: str, decided: bool, scenario_of: Any, pg_database: str
) -> None:
    """Every participant of the epoch is prepared when the server is SIGKILLed and started again: the
    prepared transactions are still listed afterwards, and the coordinator finishes them. Decided, the
    paused coordinator resumes and commits them; undecided, the coordinator is lost too (SIGKILL) and
    recovery rolls them back, so the next epochs replay the range."""
    scenario = scenario_of(ledger)
    pause = "after_decision" if decided else "before_decision"
    running = scenario.start("epoch", "--executor", "local", pause=pause)
    running.wait()
    epoch = in_flight(scenario)
    gids = pg_participants(scenario, epoch.number)
    with psycopg.connect(pg_database, autocommit=True) as pg:
        assert prepared(pg, scenario, epoch.number) == gids != set()
    restart_postgres()
    with psycopg.connect(pg_database, autocommit=True) as pg:
        assert prepared(pg, scenario, epoch.number) == gids  # they survived the restart
        assert committed_tasks(pg, scenario, epoch.number) == set()
    if decided:
        outcome = running.resume(timeout=120)
        assert outcome.returncode in (0, 2), outcome.stderr  # committed, or failed and left to recovery
    else:
        running.process.kill()
        running.process.wait(timeout=30)
    recovered = finish(scenario, pg_database)
    assert decided or f"epoch {epoch.number} aborted" in recovered, recovered
    final = scenario.epoch_status(epoch.number)
    assert final is (EpochStatus.COMMITTED if decided else EpochStatus.ABORTED), (final, recovered)
    with psycopg.connect(pg_database, autocommit=True) as pg:
        assert prepared(pg, scenario, epoch.number) == set()
        markers = committed_tasks(pg, scenario, epoch.number)
    assert markers == ({task_of(g) for g in gids} if decided else set())
