"""The pipelines this deployment runs, by name: ONCEFLOW_PIPELINES, parsed in this one place.

``ONCEFLOW_PIPELINES`` is a comma-separated list of ``module:attribute`` specs. The CLI uses it to
find a pipeline's spec (and so its sinks' committers) from the name an operator types.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from onceflow.errors import ConfigError
from onceflow.pipeline import Pipeline, load_pipeline

PIPELINES_ENV = "ONCEFLOW_PIPELINES"


def pipeline_paths(env: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    return [p.strip() for p in env.get(PIPELINES_ENV, "").split(",") if p.strip()]


def find_pipeline(name: str, env: Mapping[str, str] | None = None) -> Pipeline:
    """The spec of pipeline ``name`` among ONCEFLOW_PIPELINES; a clear error names what is known."""
    return find_pipeline_path(name, env)[1]


def find_pipeline_path(name: str, env: Mapping[str, str] | None = None) -> tuple[str, Pipeline]:
    """Pipeline ``name``'s ``module:attribute`` in ONCEFLOW_PIPELINES, and its spec."""
    paths = pipeline_paths(env)
    if not paths:
        raise ConfigError(
            f"pipeline {name!r}: ONCEFLOW_PIPELINES is not set; list the pipelines' specs there as "
            "module:attribute[,module:attribute...] so that onceflow can build their sinks' committers"
        )
    known = []
    for path in paths:
        spec = load_pipeline(path)
        if spec.name == name:
            return path, spec
        known.append(spec.name)
    raise ConfigError(
        f"pipeline {name!r} is not among the specs in {PIPELINES_ENV} (it lists: {', '.join(known)})"
    )
