"""Crash points: inert by default, typos refused, and a real SIGKILL exactly at the chosen hit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onceflow.errors import ConfigError
from onceflow.faults import CRASH_AT_ENV, CRASH_SKIP_ENV, CRASH_STATE_ENV, armed, crash_point, crashed

HIT_TWICE = (
    "from onceflow.faults import crash_point\nfor _ in range(2): crash_point('after_plan')\nprint('survived')"
)


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_CRASH")}
    return subprocess.run(
        [sys.executable, "-c", HIT_TWICE], env={**base, **env}, capture_output=True, text=True, check=False
    )


def test_unarmed_points_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CRASH_AT_ENV, raising=False)
    crash_point("after_plan")
    monkeypatch.setenv(CRASH_AT_ENV, "before_complete")
    crash_point("after_plan")


def test_unknown_names_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CRASH_AT_ENV, "after_plan,afterplan")
    with pytest.raises(ConfigError, match=r"unknown crash points \['afterplan'\]"):
        armed()
    with pytest.raises(ValueError, match="not declared"):
        crash_point("nowhere")


def test_an_armed_point_kills_the_process_with_sigkill() -> None:
    result = run({CRASH_AT_ENV: "after_plan"})
    assert result.returncode == -signal.SIGKILL
    assert "survived" not in result.stdout


def test_with_a_state_folder_only_the_chosen_hit_crashes_and_only_once(tmp_path: Path) -> None:
    env = {CRASH_AT_ENV: "after_plan", CRASH_STATE_ENV: str(tmp_path), CRASH_SKIP_ENV: "1"}
    first = run(env)
    assert first.returncode == -signal.SIGKILL  # hit 1 passed, hit 2 crashed
    assert crashed(tmp_path, "after_plan")
    second = run(env)  # hits 3 and 4: the crash already happened
    assert second.returncode == 0 and "survived" in second.stdout


def test_a_paused_point_waits_for_its_resume_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_CRASH")}
    env.update({"ONCEFLOW_PAUSE_AT": "after_plan", "ONCEFLOW_PAUSE_DIR": str(tmp_path)})
    child = subprocess.Popen([sys.executable, "-c", HIT_TWICE], env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "paused-after_plan").exists():
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.05)
    time.sleep(0.3)
    assert child.poll() is None  # still waiting
    (tmp_path / "resume-after_plan").touch()
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0 and "survived" in out
