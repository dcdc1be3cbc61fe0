"""What every task of a slice knows about its epoch: small, because it travels in each task's closure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any

from onceflow import redact
from onceflow.config import JsonRead, Settings
from onceflow.offsets import OffsetRange
from onceflow.pipeline import Pipeline, SinkSpec
from onceflow.sinks.registry import sink_kind


@dataclass(frozen=True)
class TaskSettings:
    """The part of the deployment's `Settings` that a slice's tasks read, and nothing more.

    A task's closure is pickled and sent to the executors (over Spark Connect's plaintext gRPC, for
    one), so it carries no ledger URL, no Spark Connect remote (its token) and no PostgreSQL DSN, but
    inside the config of a sink that writes to that PostgreSQL: each sink's config is resolved here, in
    the driver, with the kind's defaults filled in.
    """

    # Per sink name, the config its writer is built from (`SinkKind.config_for`).
    sink_configs: Mapping[str, Mapping[str, Any]]
    # Where Avro records' writer schemas are looked up (the registry's credentials, if any, with it).
    schema_registry_url: str | None = None
    schema_registry_allow_insecure_auth: bool = False
    json_read: JsonRead = "python"

    @classmethod
    def of(cls, pipeline: Pipeline, settings: Settings) -> TaskSettings:
        """The tasks' part of ``settings``, for ``pipeline``'s sinks and its state snapshot's."""
        from onceflow.state.store import state_sink  # in the driver only: tasks unpickle the result

        sinks = [*pipeline.sinks, *filter(None, [state_sink(pipeline, settings)])]
        return cls(
            sink_configs={s.name: sink_kind(s.kind).config_for(s, settings) for s in sinks},
            schema_registry_url=settings.schema_registry_url,
            schema_registry_allow_insecure_auth=settings.schema_registry_allow_insecure_auth,
            json_read=settings.json_read,
        )

    def sink_config(self, sink: SinkSpec) -> dict[str, Any]:
        """The config of ``sink``'s writer in a task (a copy: writers may not change the ref's)."""
        return dict(self.sink_configs[sink.name])

    def __repr__(self) -> str:  # a sink's config may hold its DSN: a task's log must not
        return f"TaskSettings({redact.shown(self.__dict__)!r})"


@dataclass(frozen=True)
class SliceRef:
    """One slice of one epoch, as its tasks see it. Made from the deployment's ``settings``, it keeps
    only `TaskSettings` of them (``task``): tasks never touch the ledger or Spark Connect."""

    pipeline: Pipeline
    epoch: int
    slice: int
    slice_ranges: tuple[OffsetRange, ...]
    bootstrap: str
    replaces: tuple[int, ...] = ()  # committed epochs of the same interval whose output this one replaces
    # The deployment's settings: only what tasks read of them is kept, in ``task``.
    settings: InitVar[Settings] = field(kw_only=True)
    task: TaskSettings = field(init=False)

    def __post_init__(self, settings: Settings) -> None:
        object.__setattr__(self, "task", TaskSettings.of(self.pipeline, settings))
