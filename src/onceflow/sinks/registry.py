"""Sink kinds as objects, found by name: kind ``x`` is the `SinkKind` called ``SINK_KIND`` in
``onceflow.sinks.x``.

Like Flink's ``Sink`` with ``SupportsCommitter``, one object per kind carries everything the rest of
onceflow asks of a kind: its writer and committer factories, the guarantee it gives on its own, whether
it writes directly (nothing staged), whether it can replace an interval's earlier output, which columns
it needs, its plan-time checks and the version of its committables. Adding a kind is adding one module.

A kind may also live in a subpackage beside the code it shares (`NESTED_KINDS`). Only the module of a
kind that is used gets imported, and sink modules import their client libraries
lazily, so a Spark executor that writes files never imports the Kafka or PostgreSQL clients.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from onceflow.errors import ConfigError
from onceflow.sinks.base import SinkCommitter, SinkWriter
from onceflow.storage.s3 import uses_s3

if TYPE_CHECKING:
    from onceflow.config import Settings
    from onceflow.pipeline import Pipeline, SinkSpec

Guarantee = Literal["exactly_once", "at_least_once"]
# Modules of this package that are not sink kinds.
_NOT_KINDS = frozenset({"base", "errors", "registry", "staging"})
# Kinds whose module is not ``onceflow.sinks.<kind>``: kind name -> module.
NESTED_KINDS: Mapping[str, str] = {
    "iceberg_changes": "onceflow.sinks.iceberg.changes",
    "delta_changes": "onceflow.sinks.delta.changes",
}


def _no_checks(
    spec: Pipeline, configs: Sequence[Mapping[str, Any]], parallel_tasks: int, apply: bool = True
) -> None:
    return None


def _no_defaults(settings: Settings) -> dict[str, Any]:
    return {}


def _no_group(config: Mapping[str, Any], pipeline: str) -> str | None:
    return None


def pg_defaults(settings: Settings) -> dict[str, Any]:
    """A PostgreSQL sink without ``dsn`` writes to the deployment's PostgreSQL."""
    return {"dsn": settings.pg_dsn}


def configured_columns(config: Mapping[str, Any]) -> list[str] | None:
    """The columns named by a sink's ``columns`` setting (mapping or list of pairs), if it has one."""
    columns = config.get("columns")
    if isinstance(columns, Mapping):
        return list(columns)
    if isinstance(columns, list | tuple):
        return [c[0] if isinstance(c, list | tuple) else str(c) for c in columns]
    return None


# The value types a sink setting may have: "path" is a string made absolute, "columns" a mapping of
# column name to type (or a list of [name, type] pairs), "names" a non-empty list of strings.
SETTING_TYPES: tuple[str, ...] = ("string", "integer", "boolean", "path", "columns", "names")


@dataclass(frozen=True)
class SinkSetting:
    """One key of a sink kind's config, as users write it: what docs/configuration.md's sink reference lists.

    ``default`` is the value used when the key is absent; ``default_from`` says where the value comes
    from when it is not a constant (e.g. the deployment's settings). ``minimum`` bounds integers and
    ``choices`` lists the accepted strings. A unit test compares these with what the kind's config
    parser reads, so the declaration cannot drift from the code.
    """

    key: str
    type: str
    meaning: str
    required: bool = False
    default: str | int | bool | None = None
    default_from: str | None = None
    minimum: int | None = None
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.type not in SETTING_TYPES:
            raise ValueError(f"sink setting {self.key!r}: type {self.type!r} is not one of {SETTING_TYPES}")


@dataclass(frozen=True)
class SinkKind:
    """One kind of sink: everything the coordinator, the planner and the executors need to know of it.

    ``writer`` and ``committer`` build the two halves from the sink's config (plus its name). ``direct``
    kinds make rows visible as they are written (commit has nothing to do); ``replaceable`` kinds can
    take an interval's earlier output away when a re-run commits (``on_rerun="replace"``).
    ``plan_checks(spec, configs, parallel_tasks, apply)`` refuses, before anything is written, what would
    fail later: it gets the full config (as a writer gets it, ``name`` included) of every sink of this
    kind in the pipeline at once, and how many tasks of one epoch write to each of them; with ``apply``
    it also makes the tables the epoch needs (creates them, adds the reader schema's new columns), and
    without it (a preview) it changes nothing. ``columns(config)``
    names the columns rows must have, in order, or None to take the transform's output as it is.
    ``defaults(settings)`` fills settings the sink's config leaves out from the deployment's `Settings`
    (e.g. the PostgreSQL DSN), so sinks get their settings explicitly, never through the process
    environment. ``settings`` documents the config keys users may write (`SinkSetting`).
    ``consumer_group(config, pipeline)`` names the Kafka consumer group a sink commits the input
    offsets to inside its own transaction, if it does (then nothing else may write that group).
    """

    name: str
    writer: Callable[[Mapping[str, Any]], SinkWriter]
    committer: Callable[[Mapping[str, Any]], SinkCommitter]
    guarantee: Guarantee
    direct: bool = False
    replaceable: bool = False
    committable_version: int = 1
    columns: Callable[[Mapping[str, Any]], list[str] | None] = configured_columns
    plan_checks: Callable[[Pipeline, Sequence[Mapping[str, Any]], int, bool], None] = _no_checks
    defaults: Callable[[Settings], dict[str, Any]] = _no_defaults
    settings: tuple[SinkSetting, ...] = ()
    consumer_group: Callable[[Mapping[str, Any], str], str | None] = _no_group

    def config_for(self, sink: SinkSpec, settings: Settings) -> dict[str, Any]:
        """The config a writer or committer of ``sink`` is built from: the kind's defaults from the
        settings, the sink's own config over them, and its name (which scopes its orphan scan). A sink
        that names an ``s3://`` path gets the deployment's object-store settings under ``s3`` (unless its
        config sets them); no other sink carries them."""
        config = {**self.defaults(settings), **sink.config, "name": sink.name}
        if "s3" not in config and uses_s3(config):
            config["s3"] = settings.s3.to_config() if settings.s3 is not None else {}
        return config

    def build_writer(self, config: Mapping[str, Any]) -> SinkWriter:
        """A writer for one task attempt; the config is validated here, naming any bad setting."""
        return self.writer(config)

    def build_committer(self, config: Mapping[str, Any]) -> SinkCommitter:
        return self.committer(config)


def known_kinds() -> list[str]:
    """The kinds this onceflow has: the kind modules of this package (none of them is imported)."""
    import onceflow.sinks as package

    return sorted(
        [
            *(
                m.name
                for m in pkgutil.iter_modules(package.__path__)
                if not m.name.startswith("_") and m.name not in _NOT_KINDS
            ),
            *NESTED_KINDS,
        ]
    )


def kind_module(kind: str) -> str:
    """The module that defines kind ``kind`` (its ``SINK_KIND``)."""
    return NESTED_KINDS.get(kind, f"onceflow.sinks.{kind}")


def sink_kind(kind: str) -> SinkKind:
    """The kind called ``kind``; an unknown name is refused with the list of known kinds.

    ``package.module:attribute`` names a kind of another package (a `SinkKind` object)."""
    if ":" in kind:
        from onceflow.pipeline import import_dotted

        found = import_dotted(kind)
        if not isinstance(found, SinkKind):
            raise ConfigError(f"sink kind {kind!r} is not a SinkKind object")
        return found
    if kind not in known_kinds():
        raise ConfigError(f"unknown sink kind {kind!r}; known kinds: {', '.join(known_kinds())}")
    module = kind_module(kind)
    found = getattr(importlib.import_module(module), "SINK_KIND", None)
    if not isinstance(found, SinkKind) or found.name != kind:
        raise ConfigError(f"module {module} defines no SINK_KIND named {kind!r}")
    return found


def build_writer(kind: str, config: Mapping[str, Any]) -> SinkWriter:
    return sink_kind(kind).build_writer(config)


def build_committer(kind: str, config: Mapping[str, Any]) -> SinkCommitter:
    return sink_kind(kind).build_committer(config)
