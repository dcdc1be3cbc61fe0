"""The pipelines this deployment runs, by name: ONCEFLOW_PIPELINES, parsed in this one place.

``ONCEFLOW_PIPELINES`` is a comma-separated list of ``module:attribute`` specs. The CLI uses it to
find a pipeline's spec (and so its sinks' committers) from the name an operator types.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from onceflow.errors import ConfigError
from onceflow.pipeline import Pipeline, load_pipeline

if TYPE_CHECKING:
    from onceflow.ledger import Ledger

PIPELINES_ENV = "ONCEFLOW_PIPELINES"


def pipeline_paths(env: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    return [p.strip() for p in env.get(PIPELINES_ENV, "").split(",") if p.strip()]


def find_pipeline(name: str, env: Mapping[str, str] | None = None) -> Pipeline:
    """The spec of pipeline ``name`` among ONCEFLOW_PIPELINES; a clear error names what is known."""
    return find_pipeline_path(name, env)[1]


def find_pipeline_path(name: str, env: Mapping[str, str] | None = None) -> tuple[str, Pipeline]:
    """Pipeline ``name``'s ``module:attribute`` in ONCEFLOW_PIPELINES, and its spec."""
    specs = listed_pipelines(env)
    if not specs:
        raise ConfigError(
            f"pipeline {name!r}: {PIPELINES_ENV} is not set; list the pipelines' specs there as "
            "module:attribute[,module:attribute...] (e.g. my_pipelines.clicks:PIPELINE)"
        )
    if name not in specs:
        raise ConfigError(
            f"pipeline {name!r} is not among the specs in {PIPELINES_ENV} (it lists: {', '.join(specs)})"
        )
    return specs[name]


def listed_pipelines(env: Mapping[str, str] | None = None) -> dict[str, tuple[str, Pipeline]]:
    """Every spec ONCEFLOW_PIPELINES lists, by pipeline name, with its ``module:attribute``."""
    found: dict[str, tuple[str, Pipeline]] = {}
    for path in pipeline_paths(env):
        spec = load_pipeline(path)
        found.setdefault(spec.name, (path, spec))
    return found


def known_pipeline(ledger: Ledger, name: str) -> Pipeline | None:
    """The spec of ``name`` when ONCEFLOW_PIPELINES lists it, None when only the ledger knows it (it
    planned an epoch once); a name neither knows is an error listing the names both know."""
    listed = listed_pipelines()
    if name in listed:
        return listed[name][1]
    in_ledger = ledger.pipelines()
    if name in in_ledger:
        return None
    known = sorted({*in_ledger, *listed})
    raise ConfigError(
        f"no pipeline {name!r}: the ledger at {ledger.url} and {PIPELINES_ENV} know "
        + (", ".join(repr(k) for k in known) if known else "no pipeline yet")
    )
