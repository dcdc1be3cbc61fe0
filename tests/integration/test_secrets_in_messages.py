"""A password or token given to onceflow never comes back in a message.

Each bad input carries one known secret: a PostgreSQL DSN in the ledger's form where a sink's is
expected, ledger URLs that are malformed, of another database or unreachable, Iceberg catalog
properties of a wrong type or an unreachable catalog, a Spark Connect URL with a token. The refusal must
still name what is wrong, and the secret must appear in no exception message, printed output or log
record; the Spark Connect case runs `onceflow run` to the end, where the slice's failure becomes the
epoch's abort reason in the ledger, which must not hold the token either.

Then one password, in each form a URL carries it (in the userinfo, in the query string, percent-encoded,
and after a raw '@', which drivers take for part of the host name), goes through every door a message
leaves by: the CLI's stdout and stderr, plain and with --debug's traceback, the Airflow hook's log line,
what an operator raises (an `AirflowFailException` among them) with the causes Airflow logs, and the
console's action answers. It must appear in none.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from local_stack.ports import free_port

from onceflow.cli.topics import wait_for_leaders
from onceflow.config import Settings
from onceflow.errors import OnceflowError
from onceflow.ledger import Ledger
from onceflow.sinks.iceberg import IcebergConfig
from onceflow.sinks.iceberg.spark import spark_conf
from tests.integration.engine.data import orders, produce

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-PW-1234"
ONCEFLOW = str(Path(sys.executable).with_name("onceflow"))

PIPELINE = """
import os
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

PIPELINE = Pipeline(
    name=os.environ["SECRET_PIPELINE"],
    source=KafkaSource(topics=(os.environ["SECRET_TOPIC"],)),
    format=JsonFormat(schema={"id": "int", "amount": "float", "customer": "string"}),
    sinks=(SinkSpec("out", "files", {"root": os.environ["SECRET_ROOT"], "table": "orders"}),),
)
# The same records into a PostgreSQL sink at SECRET_DSN: its own DSN, which no setting checks.
PG = Pipeline(
    name=os.environ["SECRET_PIPELINE"] + "-pg",
    source=KafkaSource(topics=(os.environ["SECRET_TOPIC"],)),
    format=JsonFormat(schema={"id": "int", "amount": "float", "customer": "string"}),
    sinks=(
        SinkSpec(
            "out",
            "postgres_2pc",
            {
                "dsn": os.environ.get("SECRET_DSN", "postgresql://127.0.0.1:9/none"),
                "table": "orders",
                "columns": {"id": "bigint"},
            },
        ),
    ),
)
"""


def _catalog(**properties: Any) -> IcebergConfig:
    return IcebergConfig.from_mapping({"table": "secrets.orders", "catalog_properties": properties})


def _cases(dead_port: int) -> dict[str, tuple[Callable[[], object], str]]:
    """Each case: the call that must refuse, and what its message must still say."""
    pg = f"onceflow:{SECRET}@127.0.0.1"
    return {
        "sink DSN in the ledger's form": (
            lambda: Settings.from_env({"ONCEFLOW_PG_DSN": f"postgresql+psycopg://{pg}:15432/onceflow"}),
            "ONCEFLOW_PG_DSN='postgresql+psycopg://onceflow:***@127.0.0.1:15432/onceflow': expected",
        ),
        "ledger URL without a scheme": (
            lambda: Settings.from_env({"ONCEFLOW_LEDGER_URL": f"{pg}/ledger"}),
            "ONCEFLOW_LEDGER_URL=",
        ),
        "ledger URL of another database": (
            lambda: Ledger.connect(f"mysql://{pg}/ledger"),
            "the ledger runs on sqlite or postgresql, not mysql",
        ),
        "ledger URL that does not parse": (
            lambda: Ledger.connect(f"postgresql://{pg}:port/ledger"),
            "not an SQLAlchemy URL",
        ),
        "unreachable ledger": (
            lambda: Ledger.connect(f"postgresql+psycopg://{pg}:{dead_port}/ledger"),
            "cannot open the ledger at",
        ),
        "catalog property of a wrong type": (
            lambda: _catalog(type="sql", uri=f"postgresql+psycopg://{pg}/c", password=SECRET, pool=5),
            "catalog_properties=",
        ),
        "unreachable catalog": (
            lambda: _catalog(
                type="sql", uri=f"postgresql+psycopg://{pg}:{dead_port}/c", warehouse="file:///tmp/w"
            ).open_catalog(),
            "cannot open the Iceberg catalog",
        ),
        "catalog Spark cannot read": (
            lambda: spark_conf("c", {"type": "sql", "uri": f"mysql://{pg}/c"}, ""),
            "Spark reads SQL catalogs in SQLite or PostgreSQL only",
        ),
        "Spark Connect URL with a token": (
            lambda: Settings.from_env({"ONCEFLOW_SPARK_REMOTE": f"sc:/127.0.0.1:15002/;token={SECRET}"}),
            "is not a Spark Connect URL",
        ),
    }


def test_each_refusal_says_what_is_wrong_without_the_secret(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    leaks = []
    for name, (call, says) in _cases(free_port()).items():
        with pytest.raises(Exception) as refused:
            call()
        message = f"{type(refused.value).__name__}: {refused.value}"
        if not isinstance(refused.value, OnceflowError) or says not in message or SECRET in message:
            leaks.append(f"{name}: {message}")
    out, err = capfd.readouterr()
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert not leaks, "\n".join(leaks)
    assert SECRET not in out + err + logged


@pytest.fixture
def world(tmp_path: Path, kafka_admin, settings: Settings) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from confluent_kafka.admin import NewTopic

    suffix = uuid.uuid4().hex[:8]
    topic = f"secrets-{suffix}"
    kafka_admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    wait_for_leaders(kafka_admin, topic, 1, timeout_s=30)
    produce(settings.kafka_bootstrap, topic, orders(0, 3))
    (tmp_path / "secret_pipeline.py").write_text(PIPELINE)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger.connect(ledger_url, check=False) as ledger:
        ledger.upgrade()
    return {
        **{k: v for k, v in os.environ.items() if k != "ONCEFLOW_DEBUG"},
        "ONCEFLOW_LEDGER_URL": ledger_url,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "ONCEFLOW_PIPELINES": "secret_pipeline:PIPELINE,secret_pipeline:PG",
        "SECRET_PIPELINE": f"secrets-{suffix}",
        "SECRET_TOPIC": topic,
        "SECRET_ROOT": str(tmp_path / "out"),
    }


def test_a_spark_connect_token_reaches_neither_the_output_nor_the_abort_reason(world: dict[str, str]) -> None:
    # A token ending in '=' (base64 padding) is a parameter pyspark refuses, quoting it whole.
    env = {**world, "ONCEFLOW_SPARK_REMOTE": f"sc://127.0.0.1:15002/;token={SECRET}=="}
    done = subprocess.run(
        [ONCEFLOW, "run", world["SECRET_PIPELINE"]], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0, done.stderr
    assert "token=***" in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr
    with Ledger.connect(world["ONCEFLOW_LEDGER_URL"]) as ledger:
        (epoch,) = ledger.epochs(world["SECRET_PIPELINE"])
    assert str(epoch.status) == "ABORTED" and epoch.abort_reason, epoch
    assert SECRET not in epoch.abort_reason
    # The console shows the abort reason to every reader of the pipeline's DAGs.
    from datetime import UTC, datetime

    from onceflow.console import page, read_model

    with Ledger.connect(world["ONCEFLOW_LEDGER_URL"]) as ledger:
        view = read_model.pipeline_view(
            ledger,
            world["SECRET_PIPELINE"],
            datetime.now(UTC),
            bootstrap=world["ONCEFLOW_KAFKA_BOOTSTRAP"],
            pipelines=(),  # the spec is not importable here: the ledger alone tells the epochs
        )
    shown = page.render_console(
        view, [world["SECRET_PIPELINE"]], base="/onceflow", user="u", can_act=False, dag_id="d", filters={}
    )
    assert "process failed" in shown and SECRET not in shown


# ---------------------------------------------------------------------------------------------------
# One password in each form a URL can carry it, through every door a message leaves by.


def _forms(port: int) -> dict[str, str]:
    """A PostgreSQL URL on ``port`` with SECRET as (part of) its password, in each form: in the userinfo,
    in the query string, percent-encoded, and with a raw '@' before it (which libpq and SQLAlchemy take
    for the end of the password, SECRET then being read as part of the host name)."""
    encoded = urllib.parse.quote(f"{SECRET}/:@", safe="")
    return {
        "userinfo": f"postgresql://onceflow:{SECRET}@127.0.0.1:{port}/x",
        "query": f"postgresql://onceflow@127.0.0.1:{port}/x?sslmode=disable&password={SECRET}",
        "percent-encoded": f"postgresql://onceflow:{encoded}@127.0.0.1:{port}/x",
        "raw @": f"postgresql://onceflow:p@{SECRET}@127.0.0.1:{port}/x",
    }


def _ledger(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def test_a_password_in_any_form_reaches_neither_stdout_nor_stderr_nor_the_debug_traceback(
    world: dict[str, str], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The CLI, plain and with --debug: a ledger URL that cannot be opened (or is refused), and a sink
    DSN whose server cannot be reached, each with the password in every form."""
    from onceflow.cli.main import main

    monkeypatch.syspath_prepend(str(Path(world["SECRET_ROOT"]).parent))
    monkeypatch.setattr(os, "environ", dict(world))
    leaks, traced = [], 0
    for form, url in _forms(free_port()).items():
        for debug in ([], ["--debug"]):
            for what, env, command in (
                ("ledger", {"ONCEFLOW_LEDGER_URL": _ledger(url)}, ["status", world["SECRET_PIPELINE"]]),
                ("sink", {"SECRET_DSN": url}, ["recover", world["SECRET_PIPELINE"] + "-pg"]),
            ):
                os.environ.clear()
                os.environ.update({**world, **env})
                import secret_pipeline

                importlib.reload(secret_pipeline)  # the sink's DSN is read when the module is
                code = main([*debug, *command])
                out, err = capfd.readouterr()
                assert code != 0, (form, what, out, err)
                traced += "Traceback (most recent call last)" in err
                if SECRET in out + err:
                    leaks.append(f"{form}, {what}, {debug}:\n{out}{err}")
    assert not leaks, "\n".join(leaks)
    assert traced >= 6  # --debug printed the tracebacks (a refused raw '@' has none to print)


def test_a_password_in_any_form_reaches_no_airflow_log_no_task_failure_and_no_console_answer(
    world: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The Airflow hook's log of the ledger URL, what an operator raises (its message and the causes
    Airflow logs with it, an `AirflowFailException` among them) and the console's action answers."""
    import traceback

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "plugins"))
    monkeypatch.syspath_prepend(str(Path(world["SECRET_ROOT"]).parent))
    monkeypatch.setattr(os, "environ", dict(world))  # the hook reads ONCEFLOW_* from here
    from onceflow_airflow.hooks import OnceflowHook
    from onceflow_airflow.operators import OnceflowRecoverOperator

    from onceflow.console import actions
    from onceflow.ledger.errors import SinkCallFailedKnown

    caplog.set_level(logging.DEBUG)
    shown: list[str] = []

    def raised(exc: BaseException) -> None:
        shown.append("".join(traceback.format_exception(exc)))

    for url in _forms(free_port()).values():
        # The hook logs the ledger URL it opens (or refuses it); the operator fails on it.
        os.environ["ONCEFLOW_LEDGER_URL"] = _ledger(url)
        os.environ.pop("SECRET_DSN", None)
        recover = OnceflowRecoverOperator(task_id=f"recover-{len(shown)}", pipeline="secret_pipeline:PG")
        for call in (OnceflowHook().settings, recover.coordinator().__enter__):
            try:
                call()
            except Exception as exc:
                raised(exc)
        # A sink that cannot be reached: the operator's coordinator, a known failure, the console.
        os.environ.update({"ONCEFLOW_LEDGER_URL": world["ONCEFLOW_LEDGER_URL"], "SECRET_DSN": url})
        import secret_pipeline

        importlib.reload(secret_pipeline)  # the sink's DSN is read when the module is
        with pytest.raises(Exception) as failed, recover.coordinator() as coordinator:
            coordinator.recover(by="a test")
        raised(failed.value)
        with pytest.raises(Exception) as known, recover.coordinator():
            raise SinkCallFailedKnown(f"epoch 1: commit of sink 'out' failed ({url} refused)")
        assert type(known.value).__name__ == "AirflowFailException", known.value
        raised(known.value)
        settings = OnceflowHook().settings()
        with Ledger.connect(settings.ledger_url) as ledger:
            spec = secret_pipeline.PG
            answer = actions.run_action(
                ledger, settings, spec.name, "recover", by="a test", find_spec=lambda _, spec=spec: spec
            )
        assert answer.outcome == "error", answer
        shown.append(json.dumps(answer.to_dict()))
    out, err = capfd.readouterr()  # Airflow's task loggers write there
    logged = "\n".join([out, err, *(r.getMessage() for r in caplog.records)])
    assert "onceflow: ledger postgresql+psycopg://" in logged  # the hook's line, with the URL hidden
    assert len(shown) >= 4 * 4
    leaks = [text for text in [*shown, logged] if SECRET in text]
    assert not leaks, "\n\n".join(leaks)
