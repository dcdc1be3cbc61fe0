"""The architecture's boundaries, checked in fresh interpreters: what each side may import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark import cloudpickle

from onceflow.config import Settings
from onceflow.engine import slice_job
from onceflow.executor.slices import SliceRef
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from tests.unit.fresh_interpreter import modules_after

EXECUTOR_SIDE = [
    "onceflow.executor.reading",
    "onceflow.executor.writing",
    "onceflow.executor.slices",
    "onceflow.executor.arrow_rows",
    *(
        f"onceflow.sinks.{kind}"
        for kind in ("files", "kafka", "plain", "postgres_2pc", "postgres_upsert", "wal")
    ),
]


# The driver's side, which no Spark task may import (SQLAlchemy comes with the ledger).
DRIVER_ONLY = ("onceflow.protocol.coordinator", "onceflow.ledger", "onceflow.engine.slice_job", "sqlalchemy")


def imported_after(*modules: str) -> list[str]:
    code = f"import importlib\nfor m in {modules!r}: importlib.import_module(m)"
    return [m for m in modules_after(code) if m.startswith("onceflow")]


def test_the_executor_side_imports_nothing_of_the_ledger_or_the_coordinator() -> None:
    loaded = imported_after(*EXECUTOR_SIDE)
    assert "onceflow.executor.writing" in loaded  # the check saw the modules it is about
    assert [
        m
        for m in loaded
        if m.startswith(("onceflow.ledger", "onceflow.protocol.coordinator", "onceflow.protocol.decisions"))
    ] == []


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


def test_what_a_slice_ships_to_its_write_tasks_imports_nothing_of_the_driver(tmp_path: Path) -> None:
    """Spark pickles the function it runs in each task, and a Python worker imports every module that
    function refers to. One helper of the driver's module there made each worker import the coordinator,
    the ledger and SQLAlchemy (tens of MB per worker)."""
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
        code = "import pickle, sys\npickle.loads(sys.stdin.buffer.read())"
        imported = modules_after(code, cloudpickle.dumps(function))
        assert "onceflow.executor.writing" in imported  # the check sees what loading brings in
        leaked = [m for m in imported if m.split(".")[0] in DRIVER_ONLY or m.startswith(DRIVER_ONLY)]
        assert not leaked, f"a write task imports driver-side modules: {leaked[:5]}"


def test_the_ledger_imports_no_coordinator_committer_or_concrete_sink() -> None:
    loaded = imported_after("onceflow.ledger", "onceflow.ledger.ledger", "onceflow.ledger.schema")
    assert "onceflow.ledger.ledger" in loaded
    forbidden = [
        m
        for m in loaded
        if m.startswith(
            ("onceflow.protocol.coordinator", "onceflow.executor", "onceflow.engine", "onceflow.sinks")
        )
    ]
    assert forbidden == []


def test_the_environment_variable_of_pipelines_is_read_in_one_module() -> None:
    from pathlib import Path

    import onceflow

    root = Path(onceflow.__file__).parent
    readers = sorted(
        str(p.relative_to(root)) for p in root.rglob("*.py") if '"ONCEFLOW_PIPELINES"' in p.read_text()
    )
    assert readers == ["config.py"]


# The test and debug switches, read where they act (`onceflow.faults`, `onceflow.errors`), not settings.
SWITCHES = {
    "faults.py": {
        "ONCEFLOW_CRASH_AT",
        "ONCEFLOW_CRASH_STATE",
        "ONCEFLOW_CRASH_SKIP",
        "ONCEFLOW_PAUSE_AT",
        "ONCEFLOW_PAUSE_DIR",
    },
    "errors.py": {"ONCEFLOW_DEBUG"},
}


def test_only_config_reads_the_environment_and_the_onceflow_variables() -> None:
    """A variable named as a string of its own (a key to look up) or any read of the environment is
    `onceflow.config`'s alone in the library; the DAGs and plugins take the Spark and executor
    variables from `Settings` too."""
    import ast
    import re
    from pathlib import Path

    import onceflow

    VARIABLE = re.compile(r"ONCEFLOW_[A-Z0-9_]+")

    def names_and_reads(path: Path) -> tuple[set[str], bool]:
        tree = ast.parse(path.read_text())
        names = {
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and VARIABLE.fullmatch(n.value)
        }
        reads = any(
            (isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv", "environb"))
            or (isinstance(n, ast.Name) and n.id in ("environ", "getenv"))
            for n in ast.walk(tree)
        )
        return names, reads

    root = Path(onceflow.__file__).parent
    found = {}
    for path in sorted(root.rglob("*.py")):
        module = str(path.relative_to(root))
        names, reads = names_and_reads(path)
        names -= SWITCHES.get(module, set())
        if module != "config.py" and (names or (reads and module not in SWITCHES)):
            found[module] = (sorted(names), reads)
    assert found == {}
    spark_and_executor = {
        "ONCEFLOW_SPARK_JOBS",
        "ONCEFLOW_SPARK_MASTER",
        "ONCEFLOW_SPARK_REMOTE",
        "ONCEFLOW_EXECUTOR",
        "ONCEFLOW_PIPELINES",
    }
    project = root.parents[1]
    outside = {
        str(path.relative_to(project)): sorted(names_and_reads(path)[0] & spark_and_executor)
        for folder in ("plugins", "dags", "spark_jobs")
        for path in sorted((project / folder).rglob("*.py"))
    }
    assert {k: v for k, v in outside.items() if v} == {}


def test_planning_sits_below_the_coordinator_and_the_engine() -> None:
    loaded = imported_after("onceflow.protocol.planning")
    assert "onceflow.protocol.planning" in loaded
    assert [m for m in loaded if m.startswith(("onceflow.protocol.coordinator", "onceflow.engine"))] == []


def test_a_pipeline_spec_is_built_without_importing_any_sink() -> None:
    code = (
        "from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec\n"
        "Pipeline('p', KafkaSource(('in',)), JsonFormat({'n': 'int'}),\n"
        "         (SinkSpec('t', 'files', {'root': '/tmp/x', 'table': 't'}),), on_rerun='replace')"
    )
    loaded = [m for m in modules_after(code) if m.startswith("onceflow")]
    assert "onceflow.pipeline" in loaded
    assert [m for m in loaded if m.startswith("onceflow.sinks")] == []


def test_the_coordinator_leaves_process_probes_and_kafka_calls_to_their_modules() -> None:
    from pathlib import Path

    import onceflow.protocol.coordinator

    source = Path(onceflow.protocol.coordinator.__file__).read_text()
    for name in ("os.kill", "socket", "KafkaMetadata", "publish_positions", "to_dict"):
        assert name not in source, name
