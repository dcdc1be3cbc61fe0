"""An epoch's bounds on the local executor: its dead letters (``max_dead_letters_per_epoch``) and its
slices' time (``transaction_timeout_s``). Past either, the epoch aborts in one line and nothing is lost:
the next run replays its range and delivers every record once."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from onceflow.config import Settings
from onceflow.engine.runner import ProcessFailed, run_epoch
from onceflow.faults import PAUSE_AT_ENV, PAUSE_DIR_ENV
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.files import read_committed_table

pytestmark = pytest.mark.integration

HERE = sys.modules[__name__]


def pipeline(stack: dict[str, str], **limits: Any) -> Pipeline:
    """Orders to one Parquet table, one slice per partition."""
    return Pipeline(
        name=stack["ONCEFLOW_TEST_PIPELINE"],
        source=KafkaSource(topics=(stack["ONCEFLOW_TEST_TOPIC"],)),
        format=JsonFormat(schema={"id": "int"}),
        sinks=(SinkSpec("out", "files", {"root": stack["ONCEFLOW_TEST_FILES"], "table": "out"}),),
        slices=3,
        **limits,
    )


def run(monkeypatch: pytest.MonkeyPatch, spec: Pipeline) -> Any:
    """One epoch of ``spec`` on the local executor (a runner loads its pipeline by its dotted path)."""
    monkeypatch.setattr(HERE, "SPEC", spec, raising=False)
    return run_epoch(f"{__name__}:SPEC", Settings.from_env(), executor="local")


def produce(bootstrap: str, topic: str, values: dict[int, list[bytes]]) -> None:
    """``values`` per partition, committed in one transaction."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)
    producer.begin_transaction()
    for partition, listed in values.items():
        for value in listed:
            producer.produce(topic, value=value, partition=partition)
    producer.commit_transaction(30)


def good(ids: range) -> list[bytes]:
    return [json.dumps({"id": i}).encode() for i in ids]


def delivered(stack: dict[str, str]) -> list[int]:
    table = read_committed_table(Path(stack["ONCEFLOW_TEST_FILES"]), "out")
    return sorted(table.column("id").to_pylist()) if table.num_rows else []


def statuses(stack: dict[str, str]) -> list[EpochStatus]:
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        return [e.status for e in ledger.epochs(stack["ONCEFLOW_TEST_PIPELINE"])]


def test_an_epoch_past_its_dead_letter_bound_aborts_in_one_line_and_is_replayed(
    stack: dict[str, str], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Five bad records in two slices (3 + 2): each slice alone is within a bound of 3, the epoch is not.
    produce(
        settings.kafka_bootstrap,
        stack["ONCEFLOW_TEST_TOPIC"],
        {
            0: [*good(range(0, 5)), b"{", b"{", b"{"],
            1: [*good(range(5, 10)), b"[]", b"[]"],
            2: good(range(10, 15)),
        },
    )
    with pytest.raises(ProcessFailed) as failed:
        run(monkeypatch, pipeline(stack, max_dead_letters_per_epoch=3))
    (line,) = [text for text in str(failed.value).splitlines() if "dead letters" in text]
    assert "5 dead letters in epoch 1" in line and "max_dead_letters_per_epoch (3)" in line
    assert statuses(stack) == [EpochStatus.ABORTED]
    assert delivered(stack) == []
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        aborted = ledger.epoch(stack["ONCEFLOW_TEST_PIPELINE"], 1)
        assert ledger.dead_letter_count(aborted.pipeline, epoch=1, include_uncommitted=True) <= 3
    assert "max_dead_letters_per_epoch (3)" in (aborted.abort_reason or "")
    # The user raises the bound: the next epoch replays the range, every good record once.
    outcome = run(monkeypatch, pipeline(stack, max_dead_letters_per_epoch=5))
    assert outcome.epoch.status == EpochStatus.COMMITTED
    assert delivered(stack) == list(range(15))
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        assert ledger.dead_letter_count(outcome.epoch.pipeline, epoch=outcome.epoch.number) == 5
        assert all(r.from_offset == 0 for r in ledger.epoch(outcome.epoch.pipeline, 2).ranges)


@pytest.mark.timeout(40)  # without a deadline the slice would wait for its resume for ten minutes
def test_a_hung_slice_ends_by_the_transaction_timeout_and_the_epoch_is_replayed(
    stack: dict[str, str], settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    produce(
        settings.kafka_bootstrap,
        stack["ONCEFLOW_TEST_TOPIC"],
        {p: good(range(p * 10, p * 10 + 10)) for p in range(3)},
    )
    pauses = tmp_path / "pauses"
    monkeypatch.setenv(PAUSE_AT_ENV, "task_mid_read")  # the first task to get there hangs
    monkeypatch.setenv(PAUSE_DIR_ENV, str(pauses))
    started = time.monotonic()
    try:
        with pytest.raises(ProcessFailed) as failed:
            run(monkeypatch, pipeline(stack, transaction_timeout_s=2))
        assert time.monotonic() - started < 20
        (line,) = [text for text in str(failed.value).splitlines() if "timeout" in text]
        assert "ran past the pipeline's transaction timeout (2 s)" in line
        assert statuses(stack) == [EpochStatus.ABORTED]
        assert (pauses / "paused-task_mid_read").exists()
    finally:
        (pauses / "resume-task_mid_read").touch()  # the abandoned slice goes on, and is refused
    monkeypatch.delenv(PAUSE_AT_ENV)
    time.sleep(1.0)  # the abandoned slice's pre-commit is refused, its staging rolled back
    assert delivered(stack) == []
    outcome = run(monkeypatch, pipeline(stack))
    assert outcome.epoch.status == EpochStatus.COMMITTED
    assert delivered(stack) == list(range(30))
    assert not any((Path(stack["ONCEFLOW_TEST_FILES"]) / "_staging").rglob("*.parquet"))
