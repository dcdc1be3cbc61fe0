"""Sinks as two halves (writer in the Spark task, committer in the coordinator); see `base`.

Each kind is a `SinkKind` object in a module of its own (see `registry`); this package imports no client
library until a sink of that kind is built.
"""

from onceflow.sinks.registry import SinkKind, build_committer, build_writer, known_kinds, sink_kind

__all__ = ["SinkKind", "build_committer", "build_writer", "known_kinds", "sink_kind"]
