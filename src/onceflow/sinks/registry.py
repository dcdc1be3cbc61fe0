"""Sink kinds by name, so that the coordinator, the CLI and Spark tasks build sinks from configuration.

Modules are imported on first use, so a Spark executor that builds a ``files`` writer never imports the
Kafka or PostgreSQL client libraries.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from onceflow.errors import ConfigError
from onceflow.sinks.base import SinkCommitter, SinkWriter


@dataclass(frozen=True)
class SinkKind:
    """Where a kind's writer and committer live, the guarantee it gives on its own, and whether its rows
    are visible as soon as they are written (``direct``: nothing is staged, commit has nothing to do)."""

    module: str
    writer: str
    committer: str
    guarantee: str
    direct: bool = False


KINDS: dict[str, SinkKind] = {
    "postgres_2pc": SinkKind(
        "onceflow.sinks.postgres_2pc", "PostgresTwoPhaseWriter", "PostgresTwoPhaseCommitter", "exactly_once"
    ),
    "files": SinkKind("onceflow.sinks.files", "FilesWriter", "FilesCommitter", "exactly_once"),
    "kafka": SinkKind("onceflow.sinks.kafka", "KafkaWriter", "KafkaCommitter", "exactly_once"),
    "postgres_upsert": SinkKind(
        "onceflow.sinks.postgres_upsert", "UpsertWriter", "UpsertCommitter", "exactly_once", direct=True
    ),
    "wal": SinkKind("onceflow.sinks.wal", "WalWriter", "WalCommitter", "at_least_once"),
    "plain": SinkKind("onceflow.sinks.plain", "PlainWriter", "PlainCommitter", "at_least_once", direct=True),
}


def sink_kind(kind: str) -> SinkKind:
    try:
        return KINDS[kind]
    except KeyError:
        raise ConfigError(f"unknown sink kind {kind!r}; known kinds: {', '.join(sorted(KINDS))}") from None


def _build(kind: str, attribute: str, config: Mapping[str, Any]) -> Any:
    spec = sink_kind(kind)
    factory = getattr(importlib.import_module(spec.module), getattr(spec, attribute))
    return factory(config)


def build_writer(kind: str, config: Mapping[str, Any]) -> SinkWriter:
    """A writer for one task attempt; the config is validated here, naming any bad setting."""
    return cast(SinkWriter, _build(kind, "writer", config))


def build_committer(kind: str, config: Mapping[str, Any]) -> SinkCommitter:
    return cast(SinkCommitter, _build(kind, "committer", config))
