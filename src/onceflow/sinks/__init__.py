"""Sinks as two halves (writer in the Spark task, committer in the coordinator); see `base`.

Build them by kind with `build_writer` / `build_committer` (see `registry`); this package imports no
client library until a sink of that kind is built.
"""

from onceflow.sinks.registry import KINDS, build_committer, build_writer, sink_kind

__all__ = ["KINDS", "build_committer", "build_writer", "sink_kind"]
