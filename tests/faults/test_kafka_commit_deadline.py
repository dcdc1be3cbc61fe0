"""The Kafka sink's commit with its broker dead: it fails within the sink's ``timeout_s``, naming the
broker and the call that got no answer, and publishes the slice exactly once when Kafka is back.

Without a deadline of its own the commit waited in ``send_offsets_to_transaction`` for as long as the
broker stayed dead (librdkafka does not time out a request waiting for a coordinator that is down), and
with it the decided epoch and its sinks' prepared transactions.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.sinks._kafka_deadline import TIMEOUT_MARGIN_S
from onceflow.sinks.kafka import KafkaCommitter, KafkaUnreachable
from tests.faults.test_restarts import INFRA
from tests.integration.kafka_sink_helpers import group_offsets, published, stage_epoch

pytestmark = [pytest.mark.integration, pytest.mark.faults]

TIMEOUT_S = 3


def kafka(action: str) -> None:
    """SIGKILL the stack's Kafka ("kill") or start it ("start"), with the operator's script."""
    args = ["stop", "--kill"] if action == "kill" else ["start"]
    done = subprocess.run([str(INFRA / "kafka.sh"), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def setup(settings: Settings, make_topic: Callable[..., str], tmp_path: Path) -> Any:
    made = {
        "pipeline": f"deadline-{uuid.uuid4().hex[:10]}",
        "input": make_topic("deadline-in", partitions=2),
        "config": {
            "topic": make_topic("deadline-out", partitions=3),
            "staging_root": str(tmp_path),
            "timeout_s": TIMEOUT_S,
            "bootstrap": settings.kafka_bootstrap,
        },
        "bootstrap": settings.kafka_bootstrap,
    }
    yield made
    kafka("start")  # idempotent: the broker is up again whatever the test did


def test_commit_with_the_broker_killed_fails_in_time_and_publishes_once_after(setup: Any) -> None:
    committables = stage_epoch(setup)

    def kill_broker(step: str) -> None:
        if step == "kafka.produced":  # slice 0's records are in its open transaction
            kafka("kill")

    committer = KafkaCommitter(setup["config"], crash_hook=kill_broker)
    failure: list[BaseException] = []

    def commit() -> None:
        try:
            committer.commit(committables)
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=commit, daemon=True)
    started = time.monotonic()
    worker.start()
    # init_transactions and the offsets request each get timeout_s and the margin; more is a hang.
    worker.join(2 * (TIMEOUT_S + TIMEOUT_MARGIN_S) + 20)
    waited = time.monotonic() - started
    if worker.is_alive():
        kafka("start")  # lets the hung call go on, so that the test process can end
        pytest.fail(f"the commit was still waiting for the dead broker after {waited:.0f} s")
    assert len(failure) == 1 and isinstance(failure[0], KafkaUnreachable), failure
    message = str(failure[0])
    assert setup["bootstrap"] in message and "send_offsets_to_transaction" in message, message
    assert "\n" not in message

    kafka("start")
    KafkaCommitter({**setup["config"], "timeout_s": 60}).commit(committables)  # a broker just loading
    records = published(setup)
    assert sorted(v for _, _, v in records) == sorted(
        [f"s0-t0:{i}".encode() for i in range(5)]
        + [f"s0-t1:{i}".encode() for i in range(5, 9)]
        + [f"s1-t0:{i}".encode() for i in range(4)]
        + [b"\x00nokey"] * 3
    )
    assert group_offsets(setup) == {(setup["input"], 0): 9, (setup["input"], 1): 4}
