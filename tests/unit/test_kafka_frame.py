"""The JVM path's Kafka read without Spark: its options, recorded by a stand-in for ``spark.read`` (the
read is exactly the planned range, committed records only, and never waits on the broker for records
that cannot belong to it), and how often a session is asked whether it has the Kafka source."""

from __future__ import annotations

import json
from typing import Any

import pytest

from onceflow.engine.jvm_checks import kafka_source_missing
from onceflow.engine.jvm_read import FETCH_MAX_WAIT_MS, kafka_frame
from onceflow.offsets import OffsetRange

NO_KAFKA = "this Spark session has no Kafka source on its classpath"


class _Reader:
    def __init__(self) -> None:
        self.options: dict[str, str] = {}
        self.source = ""

    def format(self, source: str) -> _Reader:
        self.source = source
        return self

    def option(self, key: str, value: str) -> _Reader:
        assert key not in self.options, f"{key} set twice"
        self.options[key] = value
        return self

    def load(self) -> dict[str, Any]:
        return {"source": self.source, **self.options}


class _Spark:
    @property
    def read(self) -> _Reader:
        return _Reader()


def test_the_read_is_the_planned_range_of_committed_records_and_waits_on_no_fetch() -> None:
    loaded = kafka_frame(_Spark(), "broker:9092", [OffsetRange("in", 3, 10, 25)])
    assert loaded["source"] == "kafka"
    assert json.loads(loaded["assign"]) == {"in": [3]}
    assert json.loads(loaded["startingOffsets"]) == {"in": {"3": 10}}
    assert json.loads(loaded["endingOffsets"]) == {"in": {"3": 25}}
    assert loaded["kafka.isolation.level"] == "read_committed"
    assert loaded["failOnDataLoss"] == "true"
    # Kafka's default (500 ms) was paid by every task whose range ends at the end of the log.
    assert int(loaded["kafka.fetch.max.wait.ms"]) == FETCH_MAX_WAIT_MS <= 50


class _Frame:
    def __init__(self, answer: Exception | None = None) -> None:
        self.answer = answer
        self.resolved = 0

    @property
    def schema(self) -> str:
        self.resolved += 1
        if self.answer is not None:
            raise self.answer
        return "schema"


class _Session:
    """A session object, as `onceflow.engine.connect` keeps one per server it reaches."""


def test_a_session_is_asked_for_the_kafka_source_once_and_a_missing_source_every_time() -> None:
    frames: list[_Frame] = []

    def load(answer: Exception | None = None) -> _Frame:
        frames.append(_Frame(answer))
        return frames[-1]

    warm, restarted = _Session(), _Session()
    assert kafka_source_missing(load, warm) == (frames[0], None)
    assert kafka_source_missing(load, warm) == (frames[1], None)
    assert [f.resolved for f in frames] == [1, 0]  # the second epoch plans nothing on the server
    assert kafka_source_missing(load, restarted)[1] is None and frames[2].resolved == 1
    assert kafka_source_missing(load)[1] is None and frames[3].resolved == 1  # no session: always
    gone = Exception("[DATA_SOURCE_NOT_FOUND] Failed to find the data source: kafka")
    bare = _Session()
    for _ in range(2):  # a missing source is never remembered: a server may be given it later
        assert kafka_source_missing(lambda: load(gone), bare) == (None, NO_KAFKA)
    assert [f.resolved for f in frames[4:]] == [1, 1]
    other = RuntimeError("Kafka unreachable")
    with pytest.raises(RuntimeError, match="unreachable"):
        kafka_source_missing(lambda: load(other), _Session())
