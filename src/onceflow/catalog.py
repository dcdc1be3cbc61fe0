"""The pipelines this deployment runs, by name: the ``module:attribute`` specs of `Settings.pipelines`.

``ONCEFLOW_PIPELINES`` (read by `onceflow.config`) is a comma-separated list of ``module:attribute``
specs. The CLI and the console use it to find a pipeline's spec (and so its sinks' committers) from the
name an operator types; every function here takes that list, so each door decides where it comes from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from onceflow.errors import ConfigError
from onceflow.pipeline import Pipeline, load_pipeline

if TYPE_CHECKING:
    from onceflow.ledger import Ledger


def find_pipeline(name: str, pipelines: Sequence[str]) -> Pipeline:
    """The spec of pipeline ``name`` among ``pipelines``; a clear error names what is known."""
    return find_pipeline_path(name, pipelines)[1]


def find_pipeline_path(name: str, pipelines: Sequence[str]) -> tuple[str, Pipeline]:
    """Pipeline ``name``'s ``module:attribute`` in ``pipelines``, and its spec."""
    specs = listed_pipelines(pipelines)
    if not specs:
        raise ConfigError(
            f"pipeline {name!r}: ONCEFLOW_PIPELINES is not set; list the pipelines' specs there as "
            "module:attribute[,module:attribute...] (e.g. my_pipelines.clicks:PIPELINE)"
        )
    if name not in specs:
        raise ConfigError(
            f"pipeline {name!r} is not among the specs in ONCEFLOW_PIPELINES (it lists: {', '.join(specs)})"
        )
    return specs[name]


def listed_pipelines(pipelines: Sequence[str]) -> dict[str, tuple[str, Pipeline]]:
    """Every spec ``pipelines`` lists, by pipeline name, with its ``module:attribute``."""
    found: dict[str, tuple[str, Pipeline]] = {}
    for path in pipelines:
        spec = load_pipeline(path)
        found.setdefault(spec.name, (path, spec))
    return found


def known_pipeline(ledger: Ledger, name: str, pipelines: Sequence[str]) -> Pipeline | None:
    """The spec of ``name`` when ``pipelines`` lists it, None when only the ledger knows it (it planned
    an epoch once); a name neither knows is an error listing the names both know."""
    listed = listed_pipelines(pipelines)
    if name in listed:
        return listed[name][1]
    in_ledger = ledger.pipelines()
    if name in in_ledger:
        return None
    known = sorted({*in_ledger, *listed})
    raise ConfigError(
        f"no pipeline {name!r}: the ledger at {ledger.url} and ONCEFLOW_PIPELINES know "
        + (", ".join(repr(k) for k in known) if known else "no pipeline yet")
    )
