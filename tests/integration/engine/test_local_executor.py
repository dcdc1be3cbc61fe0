"""The local executor: the same protocol and sinks as the Spark job, in one process, without a JVM."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.config import Settings
from onceflow.decoding.records import DEAD_LETTER_PREFIX_BYTES
from onceflow.engine.runner import run_epoch
from onceflow.errors import ConfigError
from onceflow.ledger import EpochStatus, Ledger
from onceflow.sinks.files import read_committed_table
from tests.integration.engine.data import ORDERS, orders, pg_ids, produce

pytestmark = pytest.mark.integration

REPLICATE = "tests.integration.engine.pipelines:REPLICATE"


def test_a_pipeline_without_transform_runs_locally_with_dead_letters_and_two_sinks(
    stack, settings, pg_connect
) -> None:
    first = orders(0, 30)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], first, abort=orders(500, 4), bad=[b"{"])
    outcome = run_epoch(REPLICATE, Settings.from_env(), executor="local")
    assert outcome.epoch.status == EpochStatus.COMMITTED
    ids = sorted(o["id"] for o in first)
    assert pg_ids(pg_connect, stack["ONCEFLOW_TEST_TABLE"]) == ids
    files = read_committed_table(Path(stack["ONCEFLOW_TEST_FILES"]), "replica")
    assert sorted(files.column("id").to_pylist()) == ids
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        letters = ledger.dead_letters(outcome.epoch.pipeline)
    assert [d.letter.reason.split(":")[0] for d in letters] == ["malformed_json"]


def test_a_large_bad_record_is_kept_as_a_prefix_with_its_size_and_the_epoch_commits(
    stack, settings, pg_connect
) -> None:
    good = orders(0, 10)
    big = b'{"id": ' + b"7" * 200_000  # malformed JSON of 200 kB
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], good, bad=[big, big])
    outcome = run_epoch(REPLICATE, Settings.from_env(), executor="local")
    assert outcome.epoch.status == EpochStatus.COMMITTED
    assert pg_ids(pg_connect, stack["ONCEFLOW_TEST_TABLE"]) == sorted(o["id"] for o in good)
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        letters = [d.letter for d in ledger.dead_letters(outcome.epoch.pipeline)]
    assert len(letters) == 2 and len({d.offset for d in letters}) == 2
    for letter in letters:
        assert (letter.value, letter.value_size, letter.key_size) == (
            big[:DEAD_LETTER_PREFIX_BYTES],
            len(big),
            3,
        )


def test_a_pipeline_with_a_transform_is_refused_by_the_local_executor(stack) -> None:
    with pytest.raises(ConfigError, match="run on Spark"):
        run_epoch(ORDERS, Settings.from_env(), executor="local")


def test_at_most_once_commits_before_processing_so_a_crashed_epoch_is_never_replayed(
    stack, settings, pg_connect, tmp_path
) -> None:
    import os
    import signal
    import subprocess
    import sys

    from onceflow.faults import CRASH_AT_ENV, CRASH_SKIP_ENV, CRASH_STATE_ENV

    pipeline = "tests.integration.engine.pipelines:AT_MOST_ONCE"
    table = stack["ONCEFLOW_TEST_TABLE"] + "_amo"
    first = orders(0, 30)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], first)
    crash = {CRASH_AT_ENV: "task_mid_read", CRASH_STATE_ENV: str(tmp_path / "crash"), CRASH_SKIP_ENV: "1"}
    killed = subprocess.run(
        [sys.executable, "-m", "tests.faults.driver", "epoch", pipeline, "--executor", "local"],
        env={**os.environ, **crash},
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
            name = ledger.pipelines()[0]
            assert [e.status for e in ledger.epochs(name)] == [EpochStatus.COMMITTED]  # before processing
        delivered_before = pg_ids(pg_connect, table)
        assert len(delivered_before) < len(first)  # the task that died lost its records

        second = orders(100, 10)
        produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], second)
        outcome = run_epoch(pipeline, Settings.from_env(), executor="local")
        assert outcome.epoch.number == 2 and outcome.epoch.status == EpochStatus.COMMITTED
        delivered = pg_ids(pg_connect, table)
        assert delivered == sorted(delivered_before + [o["id"] for o in second])  # no replay, no duplicate
    finally:
        pg_connect(autocommit=True).execute(f"DROP TABLE IF EXISTS {table}")


def test_a_rerun_interval_is_a_no_op_or_with_on_rerun_replace_replaces_its_output(
    stack, settings, pg_connect
) -> None:
    from datetime import UTC, datetime, timedelta

    from onceflow.engine.runner import ProcessFailed

    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(0, 20))
    now = datetime.now(UTC)
    interval = (now - timedelta(hours=1), now + timedelta(seconds=1))
    # Default: the second run of the interval plans nothing and says why.
    run_epoch(REPLICATE, Settings.from_env(), data_interval=interval, executor="local")
    with pytest.raises(ProcessFailed, match="already processed by epoch 1"):
        run_epoch(REPLICATE, Settings.from_env(), data_interval=interval, executor="local")

    replacing = "tests.integration.engine.pipelines:REPLACING"
    table = stack["ONCEFLOW_TEST_TABLE"] + "_upsert"
    try:
        first = run_epoch(replacing, Settings.from_env(), data_interval=interval, executor="local")
        again = run_epoch(replacing, Settings.from_env(), data_interval=interval, executor="local")
        assert (first.epoch.number, again.epoch.number) == (1, 2)
        assert again.epoch.ranges == first.epoch.ranges
        ids = list(range(20))
        files = read_committed_table(Path(stack["ONCEFLOW_TEST_FILES"]), "replaced")
        assert sorted(files.column("id").to_pylist()) == ids  # epoch 2's files replaced epoch 1's
        assert pg_ids(pg_connect, table) == ids
    finally:
        pg_connect(autocommit=True).execute(f"DROP TABLE IF EXISTS {table}")


def test_a_slice_opens_one_ledger_connection_whatever_its_tasks_and_sinks(
    stack, settings, monkeypatch
) -> None:
    """N tasks x S sinks report through the driver: one connection, not one per task and sink."""
    from onceflow.engine.local_slice import run_slice_local
    from onceflow.pipeline import load_pipeline
    from onceflow.protocol.coordinator import Coordinator

    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(0, 30), bad=[b"{"])
    spec = load_pipeline(REPLICATE)
    settings_now = Settings.from_env()
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        planned = Coordinator.for_pipeline(spec, ledger, settings_now).plan(run_id="count-connections")
    assert planned.epoch is not None and planned.attempt_token is not None
    opened: list[str] = []
    connect = Ledger.connect.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Ledger], url: str, **kwargs: object) -> Ledger:
        opened.append(url)
        return connect(cls, url, **kwargs)

    monkeypatch.setattr(Ledger, "connect", classmethod(counting))
    summary = run_slice_local(spec, planned.epoch, 0, planned.attempt_token, settings_now)
    monkeypatch.undo()
    tasks, sinks = summary["tasks"], len(spec.sinks)
    assert tasks >= 2 and sinks == 2 and len(summary["results"]) == tasks * sinks
    assert len(opened) == 1
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:  # release the prepared transactions
        Coordinator.for_pipeline(spec, ledger, settings_now).abort(number=planned.epoch, reason="test done")


def test_onceflow_run_catches_up_with_a_progress_line_per_epoch(stack, settings, pg_connect) -> None:
    import os
    import subprocess
    import sys

    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(0, 30))
    onceflow = str(Path(sys.executable).with_name("onceflow"))
    root = str(Path(__file__).resolve().parents[3])  # the pipeline module lives in the tests package
    env = {**os.environ, "ONCEFLOW_PIPELINES": REPLICATE, "PYTHONPATH": root}
    name = f"{stack['ONCEFLOW_TEST_PIPELINE']}-replica"
    done = subprocess.run(
        [
            onceflow,
            "run",
            name,
            "--until-caught-up",
            "--max-records-per-partition",
            "4",
            "--executor",
            "local",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stdout.splitlines() if line.startswith("epoch ")]
    assert len(progress) >= 3 and all("/s)" in line and "left" in line for line in progress), done.stdout
    assert progress[-1].endswith(", 0 left")
    assert pg_ids(pg_connect, stack["ONCEFLOW_TEST_TABLE"]) == sorted(o["id"] for o in orders(0, 30))
