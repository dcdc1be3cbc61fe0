"""A sink writer without ``write_batch`` gets each Arrow batch as rows: a map is a dict there, at any
depth (a map inside a struct inside a list too), as the Python decoder gives it, never the list of
(key, value) pairs a plain ``to_pylist`` makes of an Arrow map."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from onceflow.committables import Committable, TaskContext
from onceflow.config import Settings
from onceflow.executor.arrow_rows import batch_rows
from onceflow.executor.slices import SliceRef
from onceflow.executor.writing import write_task_batches, write_task_sinks
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.registry import SinkKind

COUNTS = pa.map_(pa.string(), pa.int64())
ITEM = pa.struct([("sku", pa.string()), ("attrs", COUNTS)])
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("counts", COUNTS),
        ("items", pa.list_(ITEM)),
        ("nested", pa.map_(pa.string(), COUNTS)),
        ("_offset", pa.int64()),
    ]
)
ROWS: list[dict[str, Any]] = [
    {
        "id": 1,
        "counts": {"seen": 3, "kept": 1},
        "items": [{"sku": "a", "attrs": {"colour": 2}}, {"sku": "b", "attrs": {}}],
        "nested": {"outer": {"inner": 7}, "empty": {}},
        "_offset": 0,
    },
    {"id": 2, "counts": {}, "items": [{"sku": "c", "attrs": None}], "nested": None, "_offset": 1},
    {"id": 3, "counts": None, "items": [], "nested": {}, "_offset": 2},
]


def _batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(ROWS, schema=SCHEMA)


class RowsOnlyWriter:
    """A writer that takes rows only (no ``write_batch``), keeping what it was given."""

    written: ClassVar[list[Mapping[str, Any]]] = []

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.context: TaskContext | None = None

    def begin(self, task: TaskContext) -> None:
        self.context = task

    def write(self, rows: Iterable[Mapping[str, Any]]) -> None:
        RowsOnlyWriter.written.extend(rows)

    def pre_commit(self) -> Committable:
        assert self.context is not None
        c = self.context
        return Committable(c.pipeline, c.epoch, c.slice, c.task, c.attempt, c.sink)

    def abort(self) -> None:
        pass


ROWS_ONLY = SinkKind(
    "rows_only",
    writer=RowsOnlyWriter,
    committer=lambda config: None,  # type: ignore[arg-type,return-value]
    guarantee="at_least_once",
)
KIND = f"{__name__}:ROWS_ONLY"


@pytest.fixture
def written() -> Iterable[list[Mapping[str, Any]]]:
    RowsOnlyWriter.written = []
    yield RowsOnlyWriter.written


def _ref(tmp_path: Path, *sinks: SinkSpec) -> SliceRef:
    spec = Pipeline("p", KafkaSource(("in",)), JsonFormat({"n": "int"}), sinks)
    settings = Settings(tmp_path, "127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "sqlite://")
    return SliceRef(spec, 1, 0, (OffsetRange("in", 0, 0, 3),), "127.0.0.1:1", settings=settings)


def test_arrow_maps_become_dicts_at_any_depth() -> None:
    assert _batch().to_pylist()[0]["counts"] == [("seen", 3), ("kept", 1)]  # what a plain to_pylist gives
    assert list(batch_rows([_batch()])) == ROWS


def test_a_task_gives_a_writer_without_batches_its_maps_as_dicts(
    tmp_path: Path, written: list[Mapping[str, Any]]
) -> None:
    sink = SinkSpec("rows", KIND, {})
    report = write_task_batches(_ref(tmp_path, sink), sink, "s0-t0", "a", [_batch()])
    assert report.records == 3
    assert written == ROWS


def test_a_one_pass_task_gives_each_rows_only_sink_its_maps_as_dicts(
    tmp_path: Path, written: list[Mapping[str, Any]]
) -> None:
    whole, some = SinkSpec("whole", KIND, {}), SinkSpec("some", KIND, {})
    reports = write_task_sinks(
        _ref(tmp_path, whole, some), [(whole, None), (some, ["items", "nested"])], "s0-t0", "a", [_batch()]
    )
    assert [r.records for r in reports] == [3, 3]
    assert written == ROWS + [{"items": r["items"], "nested": r["nested"]} for r in ROWS]
