"""Keyed state under faults: the odd/even running sums (examples/odd_even) on Spark, SIGKILLed at the
points where state is staged, decided and committed, end equal to a fault-free run's: the sums of all
the numbers by parity, each number counted once, in the committed snapshot and in PostgreSQL."""

from __future__ import annotations

import json
import uuid

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from onceflow.config import Settings
from onceflow.state import committed_state_files
from tests.faults import harness

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]

ODD_EVEN = "examples.odd_even.pipeline:ODD_EVEN"
FAULTS = (
    harness.Crash("task_after_stage", 1),  # a Spark worker dies after staging; Spark retries the task
    harness.Crash("slice_after_precommits"),  # the driver dies with rows and state staged: abort, replay
    harness.Crash("after_decision"),  # the coordinator dies decided: recovery commits rows and state
)


def produce_numbers(bootstrap: str, topic: str, numbers: range) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in numbers:
        producer.produce(topic, key=str(n).encode(), value=json.dumps({"n": n}).encode(), partition=n % 3)
    producer.commit_transaction(30)


def fault_free_sums(last: int) -> dict[str, int]:
    return {"odd": sum(range(1, last + 1, 2)), "even": sum(range(2, last + 1, 2))}


def test_state_after_faults_equals_a_fault_free_run(settings, pg, tmp_path) -> None:
    suffix = f"-{uuid.uuid4().hex[:8]}"
    env = {"ONCEFLOW_ODD_EVEN_SUFFIX": suffix, "ONCEFLOW_FAULTS_TOPIC": f"numbers{suffix}"}
    scenario = harness.Scenario(ODD_EVEN, tmp_path, settings, env=env)
    scenario.create_topics()
    table = scenario.spec.sinks[0].config["table"]
    try:
        last = 0
        for crash in FAULTS:
            produce_numbers(
                settings.kafka_bootstrap, env["ONCEFLOW_FAULTS_TOPIC"], range(last + 1, last + 41)
            )
            last += 40
            assert scenario.epoch("submit", crash).crashed, crash
            scenario.must(scenario.run("recover"))
            scenario.catch_up("submit")
            sums = dict(pg.execute(f"SELECT parity, total FROM {table}").fetchall())
            files = committed_state_files(scenario.spec, Settings.from_env(scenario.env))
            snapshot = [row for f in files for row in pq.read_table(f).to_pylist()]
            assert sums == fault_free_sums(last), crash
            assert {r["parity"]: r["total"] for r in snapshot} == fault_free_sums(last), crash
        # Superseded snapshots are deleted one epoch later: at most the current one and its predecessor.
        state_table = files[0].parent.parent
        kept = {p.parent.name for p in state_table.glob("epoch=*/*.parquet")}
        assert len(kept) <= 2 and files[0].parent.name in kept
    finally:
        scenario.drop(pg)
