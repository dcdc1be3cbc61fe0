"""The architecture's boundaries, checked in fresh interpreters: what each side may import."""

from __future__ import annotations

import json
import subprocess
import sys

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


def imported_after(*modules: str) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(n for n in sys.modules if n.startswith('onceflow'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return list(json.loads(done.stdout))


def test_the_executor_side_imports_nothing_of_the_ledger_or_the_coordinator() -> None:
    loaded = imported_after(*EXECUTOR_SIDE)
    assert "onceflow.executor.writing" in loaded  # the check saw the modules it is about
    assert [
        m for m in loaded if m.startswith(("onceflow.ledger", "onceflow.coordinator", "onceflow.decisions"))
    ] == []


def test_the_ledger_imports_no_coordinator_committer_or_concrete_sink() -> None:
    loaded = imported_after("onceflow.ledger", "onceflow.ledger.ledger", "onceflow.ledger.schema")
    assert "onceflow.ledger.ledger" in loaded
    forbidden = [
        m
        for m in loaded
        if m.startswith(("onceflow.coordinator", "onceflow.executor", "onceflow.engine", "onceflow.sinks"))
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
    loaded = imported_after("onceflow.planning")
    assert "onceflow.planning" in loaded
    assert [m for m in loaded if m.startswith(("onceflow.coordinator", "onceflow.engine"))] == []


def test_a_pipeline_spec_is_built_without_importing_any_sink() -> None:
    code = (
        "import json, sys\n"
        "from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec\n"
        "Pipeline('p', KafkaSource(('in',)), JsonFormat({'n': 'int'}),\n"
        "         (SinkSpec('t', 'files', {'root': '/tmp/x', 'table': 't'}),), on_rerun='replace')\n"
        "print(json.dumps(sorted(n for n in sys.modules if n.startswith('onceflow'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(done.stdout)
    assert "onceflow.pipeline" in loaded
    assert [m for m in loaded if m.startswith("onceflow.sinks")] == []


def test_the_coordinator_leaves_process_probes_and_kafka_calls_to_their_modules() -> None:
    from pathlib import Path

    import onceflow.coordinator

    source = Path(onceflow.coordinator.__file__).read_text()
    for name in ("os.kill", "socket", "KafkaMetadata", "publish_positions", "to_dict"):
        assert name not in source, name
