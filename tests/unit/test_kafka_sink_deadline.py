"""The Kafka sink's deadline on a broker call: librdkafka's own timeout becomes one clear line, a call
that ignores its timeout is abandoned at the deadline, and any other failure passes through unchanged."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from onceflow.sinks import kafka
from onceflow.sinks.kafka import KafkaUnreachable, within


def test_a_call_blocking_past_its_timeout_is_given_up_at_the_deadline(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(kafka, "TIMEOUT_MARGIN_S", 0.2)
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
