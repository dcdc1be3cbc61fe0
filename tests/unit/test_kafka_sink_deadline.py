"""The Kafka sink's deadline on a broker call: librdkafka's own timeout becomes one clear line, a call
that ignores its timeout is abandoned at the deadline, and any other failure passes through unchanged.
Every producer a commit opens is closed once nothing uses it, on every path."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException

from onceflow.offsets import OffsetRange
from onceflow.sinks import _kafka_deadline as deadline
from onceflow.sinks._kafka_deadline import within
from onceflow.sinks.base import Committable
from onceflow.sinks.kafka import KafkaCommitter, KafkaUnreachable, encode_record


def test_a_call_blocking_past_its_timeout_is_given_up_at_the_deadline(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(deadline, "TIMEOUT_MARGIN_S", 0.2)
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(KafkaUnreachable) as failure:
        within("send_offsets_to_transaction", "127.0.0.1:1", 0.3, lambda: release.wait(30))
    release.set()
    assert time.monotonic() - started < 3
    assert str(failure.value).startswith(
        "kafka sink: send_offsets_to_transaction got no answer from 127.0.0.1:1 within 0.3 s"
    )


def test_librdkafkas_own_timeout_names_the_call_and_the_broker() -> None:
    def timed_out() -> None:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Transactional API operation timed out"))

    with pytest.raises(KafkaUnreachable, match="init_transactions got no answer from b:9092"):
        within("init_transactions", "b:9092", 1, timed_out)


def test_other_failures_and_results_pass_through() -> None:
    def fenced() -> None:
        raise KafkaException(KafkaError(KafkaError._FENCED, "fenced"))

    with pytest.raises(KafkaException, match="fenced"):
        within("commit_transaction", "b:9092", 1, fenced)
    assert within("reading the committed offsets", "b:9092", 1, lambda: [1, 2]) == [1, 2]


def _eventually(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_done_runs_once_after_the_call_in_time_or_once_an_abandoned_call_returns(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(deadline, "TIMEOUT_MARGIN_S", 0.1)
    finished: list[str] = []
    assert within("init_transactions", "b:9092", 1, lambda: 7, done=lambda: finished.append("quick")) == 7
    assert finished == ["quick"]
    release = threading.Event()
    with pytest.raises(KafkaUnreachable):
        within(
            "send_offsets_to_transaction", "b:9092", 0.1, release.wait, done=lambda: finished.append("late")
        )
    assert finished == ["quick"], "released while the abandoned call still runs"
    release.set()
    assert _eventually(lambda: finished == ["quick", "late"])


class FakeProducer:
    """Counts close() calls; ``send_offsets_to_transaction`` waits for ``unblock`` when it is given."""

    made: ClassVar[list[FakeProducer]] = []
    unblock: ClassVar[threading.Event | None] = None

    def __init__(self, config: dict[str, Any]) -> None:
        self.closed = 0
        self.made.append(self)

    def init_transactions(self, timeout: float) -> None: ...
    def begin_transaction(self) -> None: ...
    def produce(self, topic: str, **kwargs: Any) -> None: ...
    def flush(self, timeout: float) -> int:
        return 0

    def send_offsets_to_transaction(self, *args: Any) -> None:
        if self.unblock is not None:
            self.unblock.wait(30)

    def commit_transaction(self, timeout: float) -> None: ...
    def abort_transaction(self, timeout: float) -> None: ...
    def close(self) -> bool:
        self.closed += 1
        return True


@pytest.fixture
def committer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KafkaCommitter:
    import confluent_kafka

    FakeProducer.made, FakeProducer.unblock = [], None
    monkeypatch.setattr(confluent_kafka, "Producer", FakeProducer)
    monkeypatch.setattr(deadline, "TIMEOUT_MARGIN_S", 0.1)
    staged = tmp_path / "records.bin"
    staged.write_bytes(encode_record({"key": "k", "value": "v"}))
    done = KafkaCommitter(
        {"topic": "out", "staging_root": str(tmp_path), "bootstrap": "b:9092", "timeout_s": 1}
    )
    monkeypatch.setattr(done, "_staged_file", lambda c: staged)
    monkeypatch.setattr(done, "_group_metadata", lambda pipeline: None)
    return done


SLICE = [Committable("p", 1, 0, "s0-t0", "a1", "out", (OffsetRange("in", 0, 0, 1),))]


@pytest.mark.parametrize("published", [True, False])
def test_the_commit_closes_its_producer_whether_it_publishes_or_finds_the_slice_published(
    committer: KafkaCommitter, monkeypatch: pytest.MonkeyPatch, published: bool
) -> None:
    monkeypatch.setattr(committer, "_published", lambda pipeline, until: published)
    committer.commit(SLICE)
    assert [p.closed for p in FakeProducer.made] == [1]


def test_a_producer_held_by_an_abandoned_call_is_closed_when_that_call_returns(
    committer: KafkaCommitter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(committer, "_published", lambda pipeline, until: False)
    FakeProducer.unblock = threading.Event()
    with pytest.raises(KafkaUnreachable, match="send_offsets_to_transaction"):
        committer.commit(SLICE)
    (producer,) = FakeProducer.made
    assert producer.closed == 0, "closed under a call that still runs"
    FakeProducer.unblock.set()
    assert _eventually(lambda: producer.closed == 1)
    time.sleep(0.1)
    assert producer.closed == 1
