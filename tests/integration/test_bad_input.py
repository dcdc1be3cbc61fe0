"""Every bad input a new user hits is one clear line with its exit code, and changes nothing.

Each case runs the real `onceflow` command (the CLI and, through `onceflow run`, the runner) against the
local stack with one thing wrong, and asserts: the exit code, that stderr is exactly one line (no
traceback, no librdkafka noise) saying what failed and what to do, and that nothing was written, staged
or prepared (no epoch planned: the refused runs lost nothing). The same pipeline, set up right, delivers
every record exactly once, under a name and table of its own, so that no test depends on another's order.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from local_stack.ports import free_port

from onceflow.cli.topics import wait_for_leaders
from onceflow.ledger import Ledger
from tests.integration.engine.data import orders, produce

pytestmark = pytest.mark.integration

ONCEFLOW = str(Path(sys.executable).with_name("onceflow"))
OUT = Path(__file__).resolve().parents[1] / "faults" / "out"
RECORDS = 12

PIPELINES = """
import os
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

def _pipeline(name, sink_kind="postgres_2pc", transform=None):
    return Pipeline(
        name=name,
        source=KafkaSource(topics=(os.environ["BAD_TOPIC"],)),
        format=JsonFormat(schema={"id": "int", "amount": "float", "customer": "string"}),
        transform=transform,
        sinks=(
            SinkSpec("rows", sink_kind, {
                "table": os.environ["BAD_TABLE"],
                "columns": {"id": "bigint", "amount": "double precision", "customer": "text"},
            }),
        ),
        max_records_per_task=4,
    )

GOOD = _pipeline(os.environ["BAD_PIPELINE"])
UNKNOWN_KIND = _pipeline(os.environ["BAD_PIPELINE"], sink_kind="postgres_3pc")
BAD_TRANSFORM = _pipeline(os.environ["BAD_PIPELINE"], transform="nosuchmodule.transforms:clean")
"""


@dataclass(frozen=True)
class Case:
    """One bad input: the command, what is wrong in its environment, and the line it must get."""

    id: str
    argv: tuple[str, ...]
    line: str  # a regular expression the one line of stderr must match
    code: int = 1
    env: dict[str, str | None] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def pg_without_2pc() -> Iterator[str]:
    """A second, real PostgreSQL server with PostgreSQL's default max_prepared_transactions=0."""
    bindir = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
    data = Path(tempfile.mkdtemp(prefix="onceflow-pg0-", dir="/var/tmp"))
    port = free_port()
    as_owner: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        shutil.chown(data, "postgres", "postgres")
        as_owner = ["runuser", "-u", "postgres", "--"]
    run = {"check": True, "capture_output": True}
    subprocess.run(
        [*as_owner, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"], **run
    )
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c max_prepared_transactions=0"
    pg_ctl = [*as_owner, str(bindir / "pg_ctl"), "-D", str(data)]
    subprocess.run([*pg_ctl, "-o", options, "-l", str(data / "log"), "-w", "start"], **run)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*pg_ctl, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def world(settings, kafka_admin, tmp_path_factory) -> Iterator[dict[str, str]]:  # type: ignore[no-untyped-def]
    """A topic with records, a pipeline module in a scratch folder, and the environment to run it."""
    from confluent_kafka.admin import NewTopic

    suffix = uuid.uuid4().hex[:8]
    topic = f"bad-input-{suffix}"
    kafka_admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    folder = tmp_path_factory.mktemp("bad-input")
    (folder / "bad_pipelines.py").write_text(PIPELINES)
    (folder / "broken_syntax.py").write_text("from onceflow.pipeline import Pipeline\nPIPELINE = Pipeline(\n")
    (folder / "raises_on_import.py").write_text(
        "import os\nraise RuntimeError('no credentials for the feed')\n"
    )
    wait_for_leaders(kafka_admin, topic, 2, timeout_s=30)
    produce(settings.kafka_bootstrap, topic, orders(0, RECORDS))
    ledger_url = f"sqlite:///{folder / 'ledger.db'}"  # a ledger of its own, created here
    with Ledger.connect(ledger_url, check=False) as ledger:
        ledger.upgrade()
    env = {
        **{k: v for k, v in os.environ.items() if k != "ONCEFLOW_DEBUG"},
        "ONCEFLOW_LEDGER_URL": ledger_url,
        "PYTHONPATH": str(folder),
        "BAD_TOPIC": topic,
        "BAD_TABLE": f"bad_input_{suffix}",
        "BAD_PIPELINE": f"bad-input-{suffix}",
        "ONCEFLOW_PIPELINES": "bad_pipelines:GOOD",
    }
    yield env
    kafka_admin.delete_topics([topic])


def _cases(pg0: str, pg_dsn: str) -> list[Case]:
    base = pg_dsn.rsplit("/", 1)[0]
    return [
        Case(
            "ledger-server-unreachable",
            ("epochs", "{pipeline}"),
            r"^onceflow: error: cannot open the ledger at "
            r"postgresql\+psycopg://onceflow:\*\*\*@127\.0\.0\.1:1/x \(.*Connection refused.*\): "
            r"check ONCEFLOW_LEDGER_URL",
            env={"ONCEFLOW_LEDGER_URL": "postgresql+psycopg://onceflow:secret@127.0.0.1:1/x"},
        ),
        Case(
            "ledger-database-missing",
            ("status", "{pipeline}"),
            r"^onceflow: error: cannot open the ledger at .*/no_such_db "
            r'\(.*database "no_such_db" does not exist',
            env={"ONCEFLOW_LEDGER_URL": f"{base}/no_such_db"},
        ),
        Case(
            "ledger-url-not-a-url",
            ("epochs", "{pipeline}"),
            r"^onceflow: error: ONCEFLOW_LEDGER_URL='mysql://ledger': "
            r"the ledger runs on sqlite or postgresql",
            env={"ONCEFLOW_LEDGER_URL": "mysql://ledger"},
        ),
        Case(
            "lease-not-a-number",
            ("run", "{pipeline}", "--executor", "local"),
            r"^onceflow: error: .*ONCEFLOW_LEASE_S",
            env={"ONCEFLOW_LEASE_S": "two minutes"},
        ),
        Case(
            "pipelines-not-set",
            ("run", "{pipeline}", "--executor", "local"),
            r"^onceflow: error: pipeline '.*': ONCEFLOW_PIPELINES is not set; "
            r"list the pipelines' specs there",
            env={"ONCEFLOW_PIPELINES": None},
        ),
        Case(
            "pipeline-module-syntax-error",
            ("run", "{pipeline}", "--executor", "local"),
            r"^onceflow: error: 'broken_syntax:PIPELINE': module 'broken_syntax' has a syntax error at "
            r".*broken_syntax\.py:\d+",
            env={"ONCEFLOW_PIPELINES": "broken_syntax:PIPELINE"},
        ),
        Case(
            "pipeline-module-raises-on-import",
            ("preview", "{pipeline}"),
            r"^onceflow: error: 'raises_on_import:PIPELINE': importing module 'raises_on_import' raised "
            r"RuntimeError: no credentials for the feed \(at .*raises_on_import\.py:2\)",
            env={"ONCEFLOW_PIPELINES": "raises_on_import:PIPELINE"},
        ),
        Case(
            "pipeline-module-missing",
            ("recover", "{pipeline}"),
            r"^onceflow: error: 'my_pipelines:PIPELINE': cannot import module 'my_pipelines' "
            r"\(No module named 'my_pipelines'\); is its folder on PYTHONPATH\?",
            env={"ONCEFLOW_PIPELINES": "my_pipelines:PIPELINE"},
        ),
        Case(
            "unknown-pipeline-epochs",
            ("epochs", "nosuch"),
            r"^onceflow: error: no pipeline 'nosuch': "
            r"the ledger at .* and ONCEFLOW_PIPELINES know .*'{pipeline}'",
        ),
        Case(
            "unknown-pipeline-status",
            ("status", "nosuch"),
            r"^onceflow: error: no pipeline 'nosuch': .*'{pipeline}'",
        ),
        Case(
            "unknown-pipeline-recover",
            ("recover", "nosuch"),
            r"^onceflow: error: pipeline 'nosuch' is not among the specs in ONCEFLOW_PIPELINES "
            r"\(it lists: {pipeline}\)",
        ),
        Case(
            "kafka-unreachable",
            ("preview", "{pipeline}"),
            r"^onceflow: error: Kafka at 127\.0\.0\.1:1 did not answer a metadata request within 15s "
            r"\(.*\): check ONCEFLOW_KAFKA_BOOTSTRAP",
            env={"ONCEFLOW_KAFKA_BOOTSTRAP": "127.0.0.1:1"},
        ),
        Case(
            "unknown-sink-kind-in-preview",
            ("preview", "{pipeline}"),
            r"^onceflow: error: unknown sink kind 'postgres_3pc'; known kinds: .*postgres_2pc",
            env={"ONCEFLOW_PIPELINES": "bad_pipelines:UNKNOWN_KIND"},
        ),
        Case(
            "transform-not-importable-in-preview",
            ("preview", "{pipeline}"),
            r"^onceflow: error: 'nosuchmodule\.transforms:clean': "
            r"cannot import module 'nosuchmodule\.transforms'",
            env={"ONCEFLOW_PIPELINES": "bad_pipelines:BAD_TRANSFORM"},
        ),
        Case(
            "sink-postgres-unreachable",
            ("run", "{pipeline}", "--executor", "local"),
            r"^onceflow: error: pipeline '{pipeline}': the sweep could not list the staged work of sink "
            r"'rows' \(OperationalError: .*port 1 failed: Connection refused.*\); nothing was changed",
            env={"ONCEFLOW_PG_DSN": "postgresql://onceflow:onceflow@127.0.0.1:1/onceflow"},
        ),
        Case(
            "sink-postgres-without-prepared-transactions",
            ("run", "{pipeline}", "--executor", "local"),
            r"^onceflow: error: sinks \['rows'\] need up to \d+ prepared transactions at once on PostgreSQL "
            r"at 127\.0\.0\.1:\d+/postgres .* but its max_prepared_transactions is 0: set "
            r"max_prepared_transactions >= \d+",
            env={"ONCEFLOW_PG_DSN": pg0},
        ),
        Case(
            "sink-postgres-without-prepared-transactions-in-preview",
            ("preview", "{pipeline}"),
            r"^onceflow: error: sinks \['rows'\] need up to \d+ prepared transactions .* "
            r"max_prepared_transactions is 0",
            env={"ONCEFLOW_PG_DSN": pg0},
        ),
        Case(
            "sink-table-column-of-another-type",
            ("run", "{pipeline}", "--executor", "local"),
            r"^onceflow: error: sink 'rows': column 'amount' of table '{table}' is integer, but the sink's "
            r"columns say 'double precision'",
            files={"table": "id bigint, amount integer, customer text"},
        ),
    ]


def _onceflow(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ONCEFLOW, *argv], env=env, capture_output=True, text=True, timeout=120)


def _nothing_written(env: dict[str, str], settings) -> None:  # type: ignore[no-untyped-def]
    pipeline, table = env["BAD_PIPELINE"], env["BAD_TABLE"]
    with Ledger.connect(env["ONCEFLOW_LEDGER_URL"]) as ledger:
        assert ledger.epochs(pipeline) == [], "a refused command planned an epoch"
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        prepared = conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", [f"onceflow:{pipeline}:%"]
        ).fetchone()
        assert prepared == (0,), "a refused command left prepared transactions"
        exists = conn.execute("SELECT to_regclass(%s)", [table]).fetchone()
        if exists is not None and exists[0] is not None:
            assert conn.execute(f'SELECT count(*) FROM "{table}"').fetchone() == (0,)


def test_each_bad_input_is_one_line_with_its_exit_code_and_writes_nothing(
    world, settings, pg_without_2pc
) -> None:
    failures = []
    rows = ["| input | exit | the one line |", "| --- | --- | --- |"]
    password = urlsplit(settings.pg_dsn).password
    for case in _cases(pg_without_2pc, settings.pg_dsn):
        env = {**world}
        for key, value in case.env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS "{world["BAD_TABLE"]}"')
            if "table" in case.files:
                conn.execute(f'CREATE TABLE "{world["BAD_TABLE"]}" ({case.files["table"]})')
        argv = [a.format(pipeline=world["BAD_PIPELINE"]) for a in case.argv]
        done = _onceflow(argv, env)
        lines = done.stderr.splitlines()
        pattern = case.line.replace("{pipeline}", re.escape(world["BAD_PIPELINE"])).replace(
            "{table}", re.escape(world["BAD_TABLE"])
        )
        if done.returncode != case.code or len(lines) != 1 or not re.search(pattern, lines[0]):
            failures.append(f"{case.id}: exit {done.returncode} (want {case.code}), stderr:\n{done.stderr}")
        if password and f":{password}@" in done.stdout + done.stderr:
            failures.append(f"{case.id}: the PostgreSQL password is printed:\n{done.stderr}")
        rows.append(f"| {case.id} | {done.returncode} | {' / '.join(lines)} |")
        _nothing_written(world, settings)
    # The inputs tried and what each got, for a person to read (tests/faults/out/ is not committed).
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bad-input.md").write_text("\n".join(rows) + "\n")
    assert not failures, "\n\n".join(failures)


def test_debug_adds_the_traceback_before_the_same_line(world) -> None:
    env = {**world, "ONCEFLOW_PIPELINES": "raises_on_import:PIPELINE"}
    plain = _onceflow(["preview", world["BAD_PIPELINE"]], env)
    debug = _onceflow(["--debug", "preview", world["BAD_PIPELINE"]], env)
    assert debug.returncode == plain.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.splitlines()[-1] == plain.stderr.strip()


def test_set_up_right_the_pipeline_delivers_every_record_once(world, settings) -> None:
    """The bad inputs' pipeline, under a name and table of its own (the table of bad inputs asserts that
    its pipeline has no epoch, whichever test runs first). The table lacks a column the sink's columns
    name, as after the sink gained one: a preview changes nothing, the run adds the column before it
    writes."""
    suffix = uuid.uuid4().hex[:8]
    env = {**world, "BAD_PIPELINE": f"bad-input-right-{suffix}", "BAD_TABLE": f"bad_input_right_{suffix}"}
    table = env["BAD_TABLE"]

    def columns() -> list[str]:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            found = conn.execute(f'SELECT * FROM "{table}" LIMIT 0').description or []
            return [c.name for c in found]

    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP TABLE IF EXISTS "{table}"')
        conn.execute(f'CREATE TABLE "{table}" (id bigint, amount double precision)')
    preview = _onceflow(["preview", env["BAD_PIPELINE"]], env)
    assert preview.returncode == 0, preview.stderr
    assert columns() == ["id", "amount"]  # a dry run
    done = _onceflow(["run", env["BAD_PIPELINE"], "--until-caught-up", "--executor", "local"], env)
    assert done.returncode == 0, done.stderr
    assert columns() == ["id", "amount", "customer"]
    again = _onceflow(["commit", env["BAD_PIPELINE"], "1"], env)
    assert again.returncode == 0 and "already committed" in again.stderr, again.stderr
    refused = _onceflow(["abort", env["BAD_PIPELINE"], "1"], env)
    assert refused.returncode == 3
    assert refused.stderr.strip().startswith("onceflow: abort refused: cannot abort epoch 1"), refused.stderr
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(f'SELECT id FROM "{table}" ORDER BY id').fetchall()]
        conn.execute(f'DROP TABLE IF EXISTS "{table}"')
    assert ids == list(range(RECORDS))
