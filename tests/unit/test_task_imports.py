"""What a slice ships to Spark's Python workers refers to task-side modules only.

Spark pickles the function it runs in each task, and a Python worker imports every module that function
refers to. One helper of the driver's module there made each worker import the coordinator, the ledger
and SQLAlchemy (tens of MB per worker, and the layering says tasks import none of them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

from onceflow.config import Settings
from onceflow.engine import slice_job
from onceflow.executor.slices import SliceRef
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

# The driver's side, which no Spark task may import (SQLAlchemy comes with the ledger).
DRIVER_ONLY = ("onceflow.coordinator", "onceflow.ledger", "onceflow.engine.slice_job", "sqlalchemy")


class _Frame:
    """Stands in for a DataFrame: keeps the function given to ``mapInArrow``; the query returns nothing."""

    def __init__(self) -> None:
        self.columns = ["n"]
        self.shipped: list[Any] = []
        self.rdd = self

    def getNumPartitions(self) -> int:
        return 1

    def select(self, *columns: str) -> _Frame:
        return self

    def mapInArrow(self, function: Any, schema: Any) -> _Frame:
        self.shipped.append(function)
        return self

    def collect(self) -> list[Any]:
        return []


def _imported_by_loading(pickled: bytes) -> set[str]:
    """The modules a fresh interpreter imports to load ``pickled``, as a Python worker would."""
    code = "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); print('\\n'.join(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], input=pickled, capture_output=True, check=True)
    return set(loaded.stdout.decode().split())


def test_the_write_tasks_import_nothing_of_the_driver(tmp_path: Path) -> None:
    sinks = (
        SinkSpec("out", "files", {"root": str(tmp_path / "files"), "table": "t"}),
        SinkSpec("copy", "files", {"root": str(tmp_path / "files"), "table": "u"}),
    )
    spec = Pipeline("p", KafkaSource(("in",)), JsonFormat({"n": "int"}), sinks)
    settings = Settings(tmp_path, "127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "sqlite://")
    ref = SliceRef(spec, 1, 0, (OffsetRange("in", 0, 0, 4),), "127.0.0.1:1", settings=settings)
    frame = _Frame()
    slice_job._write_sinks(ref, list(sinks), frame, ["s0-t0"])
    slice_job._write_sink(ref, sinks[0], frame, ["s0-t0"])
    assert len(frame.shipped) == 2
    for function in frame.shipped:
        imported = _imported_by_loading(cloudpickle.dumps(function))
        assert "onceflow.executor.writing" in imported  # the check sees what loading brings in
        leaked = sorted(m for m in imported if m.split(".")[0] in DRIVER_ONLY or m.startswith(DRIVER_ONLY))
        assert not leaked, f"a write task imports driver-side modules: {leaked[:5]}"
