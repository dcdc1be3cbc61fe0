"""Build a pipeline's sink writers and committers from its spec."""

from __future__ import annotations

import os
from typing import Any

from onceflow.errors import ConfigError
from onceflow.pipeline import Pipeline, SinkSpec, load_pipeline
from onceflow.sinks import build_committer, build_writer
from onceflow.sinks.base import SinkCommitter, SinkWriter
from onceflow.state.store import state_sink


def sink_config(sink: SinkSpec) -> dict[str, Any]:
    """The sink's own config plus its name, which scopes what its orphan scan may touch."""
    return {**sink.config, "name": sink.name}


def writer_for(sink: SinkSpec) -> SinkWriter:
    return build_writer(sink.kind, sink_config(sink))


def participant_sinks(spec: Pipeline) -> tuple[SinkSpec, ...]:
    """The user's sinks plus, for a stateful pipeline, the internal sink of its state snapshot."""
    state = state_sink(spec)
    return spec.sinks if state is None else (*spec.sinks, state)


def committers_for(spec: Pipeline) -> dict[str, SinkCommitter]:
    return {sink.name: build_committer(sink.kind, sink_config(sink)) for sink in participant_sinks(spec)}


PIPELINES_ENV = "ONCEFLOW_PIPELINES"


def pipeline_committer(pipeline: str, sink: str) -> SinkCommitter:
    """A `CommitterProvider` over the pipeline specs listed in ONCEFLOW_PIPELINES.

    ONCEFLOW_PIPELINES is a comma-separated list of ``module:attribute`` specs; the CLI uses it to build
    the committers of a pipeline's sinks for ``onceflow recover``, ``commit`` and ``abort``.
    """
    paths = [p.strip() for p in os.environ.get(PIPELINES_ENV, "").split(",") if p.strip()]
    for path in paths:
        spec = load_pipeline(path)
        if spec.name != pipeline:
            continue
        candidates = participant_sinks(spec)
        for candidate in candidates:
            if candidate.name == sink:
                return build_committer(candidate.kind, sink_config(candidate))
        raise ConfigError(
            f"pipeline {pipeline!r} has no sink {sink!r} (its sinks: {', '.join(x.name for x in candidates)})"
        )
    raise ConfigError(
        f"pipeline {pipeline!r} is not among the specs in {PIPELINES_ENV}={','.join(paths)!r}; "
        "list its module:attribute there so that its sinks' committers can be built"
    )
