"""The options of the JVM path's Kafka read, recorded by a stand-in for ``spark.read`` (no Spark): the
read is exactly the planned range, committed records only, and never waits on the broker for records
that cannot belong to it."""

from __future__ import annotations

import json
from typing import Any

from onceflow.engine.jvm_read import FETCH_MAX_WAIT_MS, kafka_frame
from onceflow.offsets import OffsetRange


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
