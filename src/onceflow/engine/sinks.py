"""Build a pipeline's sink writers and committers from its spec."""

from __future__ import annotations

from typing import Any

from onceflow.pipeline import Pipeline, SinkSpec
from onceflow.sinks import build_committer, build_writer
from onceflow.sinks.base import SinkCommitter, SinkWriter


def sink_config(sink: SinkSpec) -> dict[str, Any]:
    """The sink's own config plus its name, which scopes what its orphan scan may touch."""
    return {**sink.config, "name": sink.name}


def writer_for(sink: SinkSpec) -> SinkWriter:
    return build_writer(sink.kind, sink_config(sink))


def committers_for(spec: Pipeline) -> dict[str, SinkCommitter]:
    return {sink.name: build_committer(sink.kind, sink_config(sink)) for sink in spec.sinks}
