"""The follower's own rules, without Kafka: it waits while nothing is new, backs off after a failed
epoch, and ends with the last failure when they keep coming."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from onceflow.config import Settings
from onceflow.engine import follow as following
from onceflow.engine.runner import ProcessFailed
from onceflow.ledger import Ledger

PIPELINE = "examples.clicks.pipeline:CLICKS"


class Clock(threading.Event):
    """A stop event whose waits return at once and are remembered; it sets itself after ``limit`` waits."""

    def __init__(self, limit: int = 100) -> None:
        super().__init__()
        self.waits: list[float | None] = []
        self.limit = limit

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        if len(self.waits) >= self.limit:
            self.set()
        return self.is_set()


def _settings(tmp_path: Path) -> Settings:
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.connect(url, check=False) as ledger:
        ledger.upgrade()
    return Settings(tmp_path, "127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", url)


def test_failed_epochs_back_off_and_five_in_a_row_end_the_follower_with_the_last(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tries: list[int] = []

    def failing(*_args: object, **_kwargs: object) -> None:
        tries.append(1)
        raise ProcessFailed(f"epoch {len(tries)} aborted: slice 0 failed")

    monkeypatch.setattr(following, "run_epoch", failing)
    monkeypatch.setattr(following, "has_new_records", lambda _coordinator, _max: True)
    clock, lines = Clock(), []
    with pytest.raises(ProcessFailed, match="epoch 5 aborted"):
        following.follow(PIPELINE, _settings(tmp_path), stop=clock, progress=lines.append)
    assert clock.waits == [1.0, 2.0, 4.0, 8.0]
    assert "failure 4 of 5 in a row; next try in 8 s" in lines[-1]


def test_an_idle_follower_only_looks_and_stops_when_told(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(following, "run_epoch", lambda *_a, **_k: pytest.fail("an epoch was planned"))
    monkeypatch.setattr(following, "has_new_records", lambda _coordinator, _max: False)
    clock, lines = Clock(limit=3), []
    assert following.follow(PIPELINE, _settings(tmp_path), poll_s=0.5, stop=clock, progress=lines.append) == 0
    assert clock.waits == [0.5, 0.5, 0.5]
    assert lines[-1] == "stopped after 0 committed epoch(s); nothing is in flight"
