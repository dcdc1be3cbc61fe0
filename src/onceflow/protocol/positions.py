"""Step 6 of `commit`: show a pipeline's committed position to Kafka's tools.

The ledger holds where a pipeline stands; after each committed epoch the coordinator copies it to the
consumer group ``onceflow-<pipeline>`` (`onceflow.sources.consumer_group`), unless one of the
pipeline's sinks commits that group inside its own output transaction, which already put the offsets
there, exactly as published.
"""

from __future__ import annotations

from onceflow.config import Settings
from onceflow.errors import one_line
from onceflow.ledger import Ledger
from onceflow.logs import Log
from onceflow.pipeline import Pipeline
from onceflow.sinks.registry import sink_kind
from onceflow.sources.consumer_group import position_group, publish_positions


def group_to_publish(spec: Pipeline, settings: Settings) -> str | None:
    """The consumer group the coordinator keeps in step with the ledger: ``onceflow-<pipeline>``,
    unless one of the pipeline's sinks commits that group inside its own transaction."""
    group = position_group(spec.name)
    for sink in spec.sinks:
        kind = sink_kind(sink.kind)
        if kind.consumer_group(kind.config_for(sink, settings), spec.name) == group:
            return None
    return group


def publish_position(ledger: Ledger, spec: Pipeline, settings: Settings, log: Log) -> None:
    """Write the ledger's committed positions to the position group; best effort, since it is a copy
    for Kafka's tools: a failure is one line, and the next committed epoch writes the group again."""
    group = group_to_publish(spec, settings)
    if group is None:
        return
    try:
        publish_positions(settings.kafka_bootstrap, group, ledger.committed_offsets(spec.name))
    except Exception as exc:  # never fails a commit that is done
        log(
            f"pipeline {spec.name!r}: consumer group {group!r} not updated ({one_line(exc)}); the ledger "
            "holds the position, and the next committed epoch writes the group again"
        )
