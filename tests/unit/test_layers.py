"""The library's packages in layers: every import points down (or within its own layer), no circle.

The import graph is read from the source (every ``import`` and ``from … import``, also those inside
functions), one node per package or top-level module of ``onceflow``. docs/architecture.md draws the same
layers; a new package or module must be given a layer here, which is where its place is decided.
"""

from __future__ import annotations

import ast
import graphlib
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "onceflow"

# Bottom to top. A unit may import units of its own layer or of the layers below it.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "foundations",
        frozenset(
            {"errors", "redact", "logs", "offsets", "faults", "names", "config", "committables", "storage"}
        ),
    ),
    ("the pipeline spec", frozenset({"schemas", "pipeline"})),
    ("decoding", frozenset({"decoding"})),
    ("the ledger and the sources", frozenset({"ledger", "sources", "catalog"})),
    ("sinks and state", frozenset({"sinks", "state"})),
    ("the Spark tasks' side", frozenset({"executor"})),
    ("the protocol", frozenset({"protocol"})),
    ("the runtimes", frozenset({"engine"})),
    ("the doors", frozenset({"monitoring", "console", "cli", "reference", "testing"})),
)
LAYER_OF = {unit: index for index, (_, units) in enumerate(LAYERS) for unit in units}
# What a newcomer can take in at a glance; everything else lives in a package named for its role.
MAX_TOP_LEVEL_MODULES = 15


def _unit(module: str) -> str:
    """``onceflow.ledger.models`` -> ``ledger``; ``onceflow.config`` -> ``config``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> set[str]:
    """The onceflow modules ``path`` imports, with relative imports resolved."""
    module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            if name == "onceflow":
                found.update(f"onceflow.{alias.name}" for alias in node.names)
            elif name.startswith("onceflow."):
                found.add(name)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("onceflow."))
    return found


def import_graph() -> dict[str, set[str]]:
    """Unit -> the other units it imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in SRC.rglob("*.py"):
        unit = _unit(".".join(path.relative_to(SRC.parent).with_suffix("").parts))
        graph[unit].update(_unit(m) for m in _imports(path) if _unit(m) != unit)
    return dict(graph)


def test_every_package_and_module_has_a_layer() -> None:
    units = set(import_graph()) | {_unit(m) for targets in import_graph().values() for m in targets}
    units.discard("__init__")
    assert "protocol" in units and "decoding" in units  # the scan saw the packages it is about
    assert sorted(units - set(LAYER_OF)) == [], "give each new package or module a layer in LAYERS"
    assert sorted(set(LAYER_OF) - units) == [], "LAYERS names a unit that no longer exists"


def test_imports_never_point_up_a_layer() -> None:
    upward = sorted(
        f"{unit} ({LAYERS[LAYER_OF[unit]][0]}) imports {target} ({LAYERS[LAYER_OF[target]][0]})"
        for unit, targets in import_graph().items()
        if unit in LAYER_OF
        for target in targets
        if target in LAYER_OF and LAYER_OF[target] > LAYER_OF[unit]
    )
    assert upward == []


def test_the_import_graph_has_no_circle() -> None:
    graph = import_graph()
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as cycle:
        raise AssertionError(f"import circle: {' -> '.join(cycle.args[1])}") from None
    assert order.index("errors") < order.index("protocol") < order.index("cli")


def test_the_library_imports_none_of_its_doors_or_tests() -> None:
    """dags/, plugins/, spark_jobs/, tests/ and bench/ import the library, never the reverse."""
    outside = (
        "dags",
        "plugins",
        "spark_jobs",
        "tests",
        "bench",
        "local_stack",
        "onceflow_airflow",
        "airflow",
    )
    wrong: list[str] = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            wrong += [f"{path.relative_to(SRC)}: {n}" for n in names if n.split(".")[0] in outside]
    assert wrong == []


def test_the_top_level_keeps_few_modules() -> None:
    modules = sorted(p.name for p in SRC.glob("*.py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules
