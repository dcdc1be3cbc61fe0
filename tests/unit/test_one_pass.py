"""The pieces of a one-pass slice that need no Spark: reading a printed physical plan, and one task's
batches staged in every sink at once, in order."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from onceflow.config import Settings
from onceflow.engine.plan_inspection import _PARTITION_BREAKERS, plan_leaves, plan_operators
from onceflow.executor.slices import SliceRef
from onceflow.executor.writing import write_task_sinks
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

# A slice of two read tasks through a filter, as Spark 4.1 prints it (scans shortened).
NARROW = """== Physical Plan ==
*(5) Project [id#177L, _partition#3, _offset#4L]
+- *(5) Filter (isnotnull(id#177L) AND isnull(dead#178))
   +- CollectMetrics 1f6c, [collect_list(dead#178, 0, 0) AS dead#181]
      +- Union
         :- *(2) Project [CASE WHEN ok#172 THEN _v0#173L ELSE pythonUDF0#198.id END AS id#177L]
         :  +- ArrowEvalPython [decode(raw#174)#175], [pythonUDF0#198], 250
         :     +- *(1) Project [partition#3, offset#4L, ok#172]
         :        +- *(1) Scan KafkaRelation(strategy=Assign[in-0], start=0, end=10) [key#0,value#1]
         +- *(4) Project [CASE WHEN ok#183 THEN _v0#184L ELSE pythonUDF0#199.id END AS id#192L]
            +- ArrowEvalPython [decode(raw#185)#175], [pythonUDF0#199], 250
               +- *(3) Project [partition#10, offset#11L, ok#183]
                  +- *(3) Scan KafkaRelation(strategy=Assign[in-0], start=10, end=20) [key#7,value#8]
"""
SHUFFLED = """== Physical Plan ==
*(2) HashAggregate(keys=[k#1], functions=[count(1)])
+- Exchange hashpartitioning(k#1, 4), ENSURE_REQUIREMENTS, [plan_id=20]
   +- *(1) HashAggregate(keys=[k#1], functions=[partial_count(1)])
      +- *(1) Range (0, 2, step=1, splits=2)
"""


def test_a_narrow_plan_keeps_the_reads_leaves_and_has_no_breaker() -> None:
    operators = plan_operators(NARROW)
    assert operators[0] == (0, "Project")
    assert {name for _, name in operators} & _PARTITION_BREAKERS == set()
    assert plan_leaves(operators) == ["Scan", "Scan"]


def test_a_shuffle_shows_as_an_exchange() -> None:
    operators = plan_operators(SHUFFLED)
    assert {name for _, name in operators} & _PARTITION_BREAKERS == {"Exchange"}
    assert plan_leaves(operators) == ["Range"]


def _ref(tmp_path: Path, *sinks: SinkSpec) -> SliceRef:
    spec = Pipeline("p", KafkaSource(("in",)), JsonFormat({"n": "int"}), sinks)
    settings = Settings(tmp_path, "127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "sqlite://")
    return SliceRef(spec, 1, 0, (OffsetRange("in", 0, 0, 6),), "127.0.0.1:1", settings=settings)


def _staged(root: Path) -> list[dict[str, int]]:
    files = sorted((root / "_staging").glob("**/part-*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def test_one_task_stages_every_sink_from_one_stream_in_order(tmp_path: Path) -> None:
    whole = SinkSpec("whole", "files", {"root": str(tmp_path / "whole"), "table": "t"})
    some = SinkSpec("some", "files", {"root": str(tmp_path / "some"), "table": "t"})
    ref = _ref(tmp_path, whole, some)
    batches = [
        pa.RecordBatch.from_pydict({"n": [5, 3], "_offset": [0, 1]}),
        pa.RecordBatch.from_pydict({"n": [], "_offset": []}),
        pa.RecordBatch.from_pydict({"n": [9, 1], "_offset": [2, 3]}),
    ]
    reports = write_task_sinks(ref, [(whole, None), (some, ["n"])], "s0-t0", "a", iter(batches))
    assert [(r.sink, r.task, r.attempt, r.records) for r in reports] == [
        ("whole", "s0-t0", "a", 4),
        ("some", "s0-t0", "a", 4),
    ]
    assert [r["_offset"] for r in _staged(tmp_path / "whole")] == [0, 1, 2, 3]
    assert _staged(tmp_path / "some") == [{"n": 5}, {"n": 3}, {"n": 9}, {"n": 1}]


def test_a_failed_task_rolls_back_every_sink_it_began(tmp_path: Path) -> None:
    first = SinkSpec("first", "files", {"root": str(tmp_path / "first"), "table": "t"})
    second = SinkSpec("second", "files", {"root": str(tmp_path / "second"), "table": "t"})
    ref = _ref(tmp_path, first, second)

    def failing() -> object:
        yield pa.RecordBatch.from_pydict({"n": [1]})
        raise RuntimeError("the executor lost its input")

    with pytest.raises(RuntimeError, match="lost its input"):
        write_task_sinks(ref, [(first, None), (second, None)], "s0-t0", "a", failing())  # type: ignore[arg-type]
    assert _staged(tmp_path / "first") == [] and _staged(tmp_path / "second") == []
