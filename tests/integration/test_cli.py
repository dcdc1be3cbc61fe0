"""The real ``onceflow`` console script, run in a subprocess against an SQLite file ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from onceflow.config import Settings
from onceflow.ledger import EpochStatus, Ledger
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.base import Committable
from onceflow.testing import RecordingCommitter, coordinator_for_tests

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ONCEFLOW = Path(sys.executable).with_name("onceflow")
SINK_DIR_VAR = "ONCEFLOW_TEST_SINK_DIR"
P = "clicks"


# The spec the console script finds through ONCEFLOW_PIPELINES: its sink commits to a JSON file.
CLICKS = Pipeline(
    P,
    KafkaSource(("in",)),
    JsonFormat({"n": "int"}),
    (SinkSpec("db", "onceflow.testing:RECORDING_KIND", {"dir": os.environ.get(SINK_DIR_VAR, "/nowhere")}),),
)


@pytest.fixture
def cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    env = {
        **os.environ,
        "ONCEFLOW_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.db'}",
        "ONCEFLOW_PIPELINES": f"{__name__}:CLICKS",
        SINK_DIR_VAR: str(tmp_path),
        "PYTHONPATH": str(ROOT),
    }

    def run(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(ONCEFLOW), *args],
            env={**env, **extra_env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


@pytest.fixture
def ledger(tmp_path: Path, cli: Callable[..., subprocess.CompletedProcess[str]]) -> Ledger:
    done = cli("db", "upgrade")
    assert done.returncode == 0, done.stderr
    return Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}")


def sink(tmp_path: Path, name: str) -> RecordingCommitter:
    return RecordingCommitter(path=tmp_path / f"{name}.json").refresh()


def stage(tmp_path: Path, ledger: Ledger, epoch: int, token: str, name: str, task: str) -> Committable:
    c = Committable(P, epoch, 0, task, "a0", name)
    sink(tmp_path, name).stage(c)
    ledger.precommit_slice(P, epoch, token, [c])
    return c


def test_uninitialised_ledger_says_to_run_db_upgrade(
    cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    before = cli("epochs", P)
    assert before.returncode == 1
    assert "not initialised, run `onceflow db upgrade`" in before.stderr
    assert cli("db", "upgrade").returncode == 0
    assert cli("db", "upgrade").returncode == 0
    after = cli("epochs", P)
    assert after.returncode == 0 and "has no epochs" in after.stdout


def test_commit_is_refused_until_ready_then_idempotent_and_abort_is_refused(
    tmp_path: Path, ledger: Ledger, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    e = ledger.plan_epoch(P, [OffsetRange("in", 0, 0, 7)], [("db", "t0"), ("db", "t1")])
    stage(tmp_path, ledger, 1, e.attempt_token, "db", "t0")
    early = cli("commit", P, "1")
    assert early.returncode == 3, early.stderr
    assert "have not pre-committed (db/t1)" in early.stderr
    stage(tmp_path, ledger, 1, e.attempt_token, "db", "t1")
    for _ in range(2):
        done = cli("commit", P, "1")
        assert done.returncode == 0, done.stderr
        assert "COMMITTED" in done.stdout
    assert len(sink(tmp_path, "db").visible) == 2
    refused = cli("abort", P, "1")
    assert refused.returncode == 3
    assert "cannot abort epoch 1 of pipeline 'clicks': it is COMMITTED" in refused.stderr
    listed = cli("epochs", P, "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["status"] == "COMMITTED"
    assert row["ranges"] == [{"topic": "in", "partition": 0, "from": 0, "until": 7}]
    assert {(p["task"], p["status"]) for p in row["participants"]} == {
        ("t0", "COMMITTED"),
        ("t1", "COMMITTED"),
    }
    text = cli("epochs", P)
    assert "COMMITTED" in text.stdout and "in[0]@[0,7)" in text.stdout


def test_abort_is_idempotent_and_then_commit_is_refused(
    tmp_path: Path, ledger: Ledger, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    e = ledger.plan_epoch(P, [OffsetRange("in", 0, 0, 7)], [("db", "t0")])
    stage(tmp_path, ledger, 1, e.attempt_token, "db", "t0")
    for _ in range(2):
        done = cli("abort", P, "1", "--reason", "bad deploy")
        assert done.returncode == 0, done.stderr
    assert ledger.epoch(P, 1).abort_reason == "bad deploy"
    refused = cli("commit", P, "1")
    assert refused.returncode == 3 and "it is ABORTED" in refused.stderr
    db = sink(tmp_path, "db")
    assert not db.staged and not db.visible
    missing = cli("commit", P, "9")
    assert missing.returncode == 1 and "has no epoch 9" in missing.stderr


def test_recover_rolls_back_the_undecided_epoch_and_orphans(
    tmp_path: Path, ledger: Ledger, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    e = ledger.plan_epoch(P, [OffsetRange("in", 0, 0, 7)], [("db", "t0"), ("db", "t1")])
    stage(tmp_path, ledger, 1, e.attempt_token, "db", "t0")
    sink(tmp_path, "db").stage(Committable(P, 1, 0, "t1", "crashed", "db"))
    done = cli("recover", P, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["epoch"], report["outcome"], report["participants_aborted"]) == (1, "aborted", 1)
    assert [o["attempt"] for o in report["orphans_aborted"]] == ["crashed"]
    assert ledger.epoch(P, 1).status is EpochStatus.ABORTED
    assert not sink(tmp_path, "db").staged
    again = cli("recover", P)
    assert again.returncode == 0 and "nothing in flight" in again.stdout


def test_ledger_url_flag_overrides_the_environment(
    tmp_path: Path, ledger: Ledger, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    ledger.plan_epoch(P, [], [])
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    elsewhere = f"sqlite:///{tmp_path / 'other' / 'nothing.db'}"
    done = cli("--ledger-url", url, "epochs", P, "--json", ONCEFLOW_LEDGER_URL=elsewhere)
    assert done.returncode == 0, done.stderr
    assert [row["status"] for row in json.loads(done.stdout)] == ["PLANNED"]


def test_status_reports_position_epoch_in_flight_and_lag(
    tmp_path: Path,
    settings: Settings,
    make_topic: Callable[..., str],
    ledger: Ledger,
    cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    from confluent_kafka import Producer

    topic = make_topic("cli-status", partitions=2)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for i in range(5):
        producer.produce(topic, value=b"x", partition=0 if i < 4 else 1)
    assert producer.flush(30) == 0
    e1 = ledger.plan_epoch(P, [OffsetRange(topic, 0, 0, 3), OffsetRange(topic, 1, 0, 1)], [])
    coordinator_for_tests(ledger, P, {}).commit(number=e1.number)
    ledger.plan_epoch(P, [OffsetRange(topic, 0, 3, 4)], [])

    # The ledger knows the pipeline; without its spec, status reads the partitions it has positions for.
    done = cli("status", P, "--json", ONCEFLOW_PIPELINES="")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["kafka"] == "ok"
    positions = [
        (p["partition"], p["committed"], p["last_stable_offset"], p["lag"]) for p in status["positions"]
    ]
    assert positions == [(0, 3, 4, 1), (1, 1, 1, 0)]
    assert (status["in_flight"]["epoch"], status["in_flight"]["status"]) == (2, "PLANNED")

    down = cli(
        "status", P, "--kafka-timeout", "1", ONCEFLOW_KAFKA_BOOTSTRAP="127.0.0.1:1", ONCEFLOW_PIPELINES=""
    )
    assert down.returncode == 0, down.stderr
    assert "lag unknown: Kafka at 127.0.0.1:1 did not answer" in down.stdout
    assert f"{topic}[0] committed 3 lag ?" in down.stdout


def test_status_counts_lag_to_the_last_stable_offset_on_every_partition_of_a_new_pipeline(
    tmp_path: Path,
    settings: Settings,
    make_topic: Callable[..., str],
    ledger: Ledger,
    cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """Records waiting on a partition nothing was committed for are lag; records of a transaction that
    is still open are not (a read_committed epoch cannot read them yet)."""
    import uuid

    from confluent_kafka import Producer

    topic = make_topic("cli-lag", partitions=2)
    committed = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for _ in range(3):
        committed.produce(topic, value=b"x", partition=0)
    assert committed.flush(30) == 0
    open_txn = Producer({"bootstrap.servers": settings.kafka_bootstrap, "transactional.id": uuid.uuid4().hex})
    open_txn.init_transactions(30)
    open_txn.begin_transaction()
    for _ in range(4):
        open_txn.produce(topic, value=b"y", partition=1)
    assert open_txn.flush(30) == 0  # written to the log, transaction still open
    try:
        spec = f"{__name__}:LAGGING"
        done = cli("status", "lagging", "--json", ONCEFLOW_PIPELINES=spec, ONCEFLOW_TEST_LAG_TOPIC=topic)
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        positions = [(p["partition"], p["committed"], p["lag"]) for p in status["positions"]]
        assert positions == [(0, None, 3), (1, None, 0)]
    finally:
        open_txn.abort_transaction(30)


# A pipeline nothing was committed for yet; the console script imports it with the test's topic.
LAGGING = Pipeline(
    "lagging",
    KafkaSource((os.environ.get("ONCEFLOW_TEST_LAG_TOPIC", "lag"),)),
    JsonFormat({"n": "int"}),
    (SinkSpec("db", "onceflow.testing:RECORDING_KIND", {"dir": "/nowhere"}),),
)
