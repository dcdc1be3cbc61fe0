"""An in-memory sink committer for tests of code that drives the ledger (not a real sink), and the one
way tests and tools build a coordinator over such committers (`coordinator_for_tests`).

It models what matters to the protocol: output is *staged* by a writer, becomes *visible* on commit and
disappears on abort; committing or aborting twice is a no-op; aborting visible output and committing output
that was rolled back are errors, as in a real sink. Every call is recorded. With ``path`` the state lives in a
JSON file, so that another process (the console script, a racing worker) can use the same sink.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.committables import Committable
from onceflow.config import Settings
from onceflow.logs import Log, quiet
from onceflow.sinks.registry import SinkKind

if TYPE_CHECKING:  # the recording kind also loads where tasks run, which import no ledger nor coordinator
    from onceflow.ledger import Ledger
    from onceflow.pipeline import Pipeline
    from onceflow.protocol.coordinator import Coordinator
    from onceflow.sinks.base import SinkCommitter

Key = tuple[str, int, str, str, str]


def key_of(c: Committable) -> Key:
    return (c.pipeline, c.epoch, c.sink, c.task, c.attempt)


class StagedOutputGone(RuntimeError):
    """commit() of output that was never staged or was rolled back."""


class CommittedOutputAborted(RuntimeError):
    """abort() of output that is already visible."""


@dataclass
class RecordingCommitter:
    path: Path | None = None
    require_staged: bool = True
    staged: dict[Key, Committable] = field(default_factory=dict)
    visible: dict[Key, Committable] = field(default_factory=dict)
    calls: list[tuple[str, tuple[Key, ...]]] = field(default_factory=list)
    # Number of upcoming commit() calls that raise before doing anything (a simulated crash).
    fail_commits: int = 0

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        self.staged = {key_of(c): c for c in map(Committable.from_json, data["staged"])}
        self.visible = {key_of(c): c for c in map(Committable.from_json, data["visible"])}
        self.calls = [(op, tuple(tuple(k) for k in keys)) for op, keys in data["calls"]]

    def _save(self) -> None:
        if self.path is None:
            return
        data = {
            "staged": [c.to_json() for c in self.staged.values()],
            "visible": [c.to_json() for c in self.visible.values()],
            "calls": [[op, [list(k) for k in keys]] for op, keys in self.calls],
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)

    def refresh(self) -> RecordingCommitter:
        self._load()
        return self

    def stage(self, c: Committable) -> None:
        """The writer's half: what a task's pre_commit() leaves behind."""
        self._load()
        self.staged[key_of(c)] = c
        self._save()

    def commit(self, committables: Sequence[Committable]) -> None:
        self._load()
        self.calls.append(("commit", tuple(key_of(c) for c in committables)))
        if self.fail_commits > 0:
            self.fail_commits -= 1
            self._save()
            raise ConnectionError("simulated crash before the sink committed")
        for c in committables:
            k = key_of(c)
            if k in self.visible:
                continue
            if k not in self.staged and self.require_staged:
                raise StagedOutputGone(f"cannot commit {k}: nothing staged (rolled back?)")
            self.staged.pop(k, None)
            self.visible[k] = c
        self._save()

    def abort(self, committables: Sequence[Committable]) -> None:
        self._load()
        self.calls.append(("abort", tuple(key_of(c) for c in committables)))
        for c in committables:
            k = key_of(c)
            if k in self.visible:
                raise CommittedOutputAborted(f"cannot abort {k}: already committed")
            self.staged.pop(k, None)
        self._save()

    def orphans(self, pipeline: str) -> list[Committable]:
        self._load()
        return [c for k, c in self.staged.items() if k[0] == pipeline]


def _no_writer(config: Mapping[str, Any]) -> Any:
    raise NotImplementedError(
        "the recording sink kind only commits: tests stage with RecordingCommitter.stage"
    )


def _recording_committer(config: Mapping[str, Any]) -> RecordingCommitter:
    """One JSON file per sink under the config's ``dir``, shared by every process of a test."""
    return RecordingCommitter(path=Path(config["dir"]) / f"{config['name']}.json")


# A sink kind over `RecordingCommitter`, for pipeline specs in tests (``kind="onceflow.testing:
# RECORDING_KIND"``, config ``{"dir": folder}``).
RECORDING_KIND = SinkKind(
    name="recording", writer=_no_writer, committer=_recording_committer, guarantee="exactly_once"
)


def settings_for_tests(ledger: Ledger, **changes: Any) -> Settings:
    """Settings for a coordinator over in-memory committers: the ledger's URL, a Kafka and a PostgreSQL
    that nothing listens on (such a coordinator has no spec, so it never reaches them), and no retention
    after commits, so that a test reads back every epoch it made. ``changes`` replace any field."""
    base = Settings(
        home=Path(tempfile.gettempdir()) / "onceflow-tests",
        kafka_bootstrap="127.0.0.1:9",
        pg_dsn="postgresql://onceflow-tests@127.0.0.1:9/none",
        ledger_url=ledger.url,
        retain_epochs=0,
    )
    return dataclasses.replace(base, **changes)


def coordinator_for_tests(
    ledger: Ledger,
    pipeline: str,
    committers: Mapping[str, SinkCommitter] | None = None,
    *,
    settings: Settings | None = None,
    spec: Pipeline | None = None,
    log: Log = quiet,
) -> Coordinator:
    """A coordinator of ``pipeline`` over ``committers``, with `settings_for_tests` unless given others."""
    from onceflow.protocol.coordinator import Coordinator

    return Coordinator(
        ledger,
        pipeline,
        committers,
        settings=settings_for_tests(ledger) if settings is None else settings,
        spec=spec,
        log=log,
    )
