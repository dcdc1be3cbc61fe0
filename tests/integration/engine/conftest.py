"""The engine tests' stack: unique names per test, exported so that the spark-submit child sees them."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from onceflow.engine.slice_job import SLICE_SQL_CONF
from onceflow.engine.submit import CONNECT_MODE_ENV
from onceflow.ledger import Ledger

REMOTE = os.environ.get("ONCEFLOW_SPARK_REMOTE", "sc://127.0.0.1:15002")


@pytest.fixture
def stack(settings, make_topic, pg_connect, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A unique topic (3 partitions), table, files root, state root and SQLite ledger."""
    suffix = uuid.uuid4().hex[:8]
    topic = make_topic("engine", partitions=3)
    env = {
        "ONCEFLOW_TEST_PIPELINE": f"engine-{suffix}",
        "ONCEFLOW_TEST_TOPIC": topic,
        "ONCEFLOW_TEST_TABLE": f"engine_orders_{suffix}",
        "ONCEFLOW_TEST_FILES": str(tmp_path / "files"),
        "ONCEFLOW_HOME": str(tmp_path / "home"),
        "ONCEFLOW_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.db'}",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # The spec module reads these variables at import: make this process import it afresh too.
    monkeypatch.delitem(sys.modules, "tests.integration.engine.pipelines", raising=False)
    ledger = Ledger.connect(env["ONCEFLOW_LEDGER_URL"], check=False)
    ledger.upgrade()
    ledger.close()
    yield env
    conn = pg_connect(autocommit=True)
    # A test that failed mid-epoch may leave the pipeline's prepared transactions (its assertions on
    # them have run by now); their locks would hold the DROP for ever.
    mine = f"onceflow:{env['ONCEFLOW_TEST_PIPELINE']}:%"
    leftover = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (mine,)).fetchall()
    for (gid,) in leftover:
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    conn.execute(f"DROP TABLE IF EXISTS {env['ONCEFLOW_TEST_TABLE']}")


REPO = Path(__file__).resolve().parents[3]


def _classic_session() -> Any:
    """A classic local session with Spark's Kafka source and spark-avro (resolved by `infra/spark.sh
    jars`)."""
    from pyspark.sql import SparkSession

    cache = Path(os.environ.get("ONCEFLOW_CACHE") or REPO / ".cache")
    jars = sorted(cache.glob("spark-jars-*/jars/*.jar"))
    assert jars, f"no Spark Kafka source under {cache}: run `infra/spark.sh jars`"
    builder = SparkSession.builder.master("local[2]").appName("onceflow-conformance")
    for key, value in {**SLICE_SQL_CONF, "spark.ui.enabled": "false"}.items():
        builder = builder.config(key, value)
    builder = builder.config("spark.pyspark.python", sys.executable)
    return builder.config("spark.jars", ",".join(str(j) for j in jars)).getOrCreate()


@pytest.fixture(scope="module", params=["classic", "connect"])
def spark(request) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """The read-path conformance tests' sessions: a classic one with the jars on its classpath, as a
    spark-submit driver has them, and the warm Spark Connect server."""
    if request.param == "classic":
        # pyspark picks Spark Connect's column and function classes while this is set (by any earlier
        # remote session of this process): a classic session needs it unset while it runs.
        with pytest.MonkeyPatch.context() as patch:
            for name in CONNECT_MODE_ENV:
                patch.delenv(name, raising=False)
            session = _classic_session()
            yield session
            session.stop()
        return
    yield from _connect_session()


@pytest.fixture(scope="module")
def connect_spark() -> Iterator[Any]:
    """The warm Spark Connect server's session alone, for conformance tests of a path the classic
    session shares expression for expression."""
    yield from _connect_session()


def _connect_session() -> Iterator[Any]:
    host, _, port = REMOTE.removeprefix("sc://").split("/", 1)[0].partition(":")
    with socket.socket() as probe:
        probe.settimeout(2)
        if probe.connect_ex((host, int(port or 15002))) != 0:
            # An integration test never skips: a skipped conformance test would prove nothing.
            pytest.fail(
                f"no Spark Connect server at {host}:{port}: run the suite with `make test`, or start it with "
                "`infra/spark.sh start`",
                pytrace=False,
            )
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(REMOTE).create()
    yield session
    session.stop()
