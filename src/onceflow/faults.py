"""Named crash points: fault-injection tests SIGKILL the real process at a known step of the protocol.

Every point is inert unless ``ONCEFLOW_CRASH_AT`` names it, and production never sets that variable.
A crash is a real ``SIGKILL`` of the calling process (the coordinator, the Spark driver or a Spark
Python worker), so nothing in the process gets to clean up: exactly what a power cut or an OOM kill does.

Variables (all optional except the first):

* ``ONCEFLOW_CRASH_AT``: comma-separated point names, from `POINTS`; an unknown name is a `ConfigError`,
  so a typo cannot make a fault test pass without a fault;
* ``ONCEFLOW_CRASH_STATE``: a folder shared by every process of the run. With it, hits are counted across
  processes and only hit number ``ONCEFLOW_CRASH_SKIP + 1`` crashes, once: a retried Spark task or the
  recovery that follows then runs through. A file ``crashed-{point}`` there records that the crash
  happened, which tests assert;
* ``ONCEFLOW_CRASH_SKIP``: how many hits to let pass first (default 0).

A point can also be armed to pause instead of crash, so that a test acts at an exact step (restarts a
broker, aborts the epoch under a running task): ``ONCEFLOW_PAUSE_AT=point`` and
``ONCEFLOW_PAUSE_DIR=folder``. The first process to reach the point writes ``paused-{point}`` there and
waits until the test creates ``resume-{point}`` (at most ten minutes); later hits pass.

These are test switches, not settings: they are read here, where the points act, in whichever process
reaches them; everything else onceflow reads from the environment goes through `onceflow.config`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from onceflow.errors import ConfigError

CRASH_AT_ENV = "ONCEFLOW_CRASH_AT"
CRASH_STATE_ENV = "ONCEFLOW_CRASH_STATE"
CRASH_SKIP_ENV = "ONCEFLOW_CRASH_SKIP"
PAUSE_AT_ENV = "ONCEFLOW_PAUSE_AT"
PAUSE_DIR_ENV = "ONCEFLOW_PAUSE_DIR"
PAUSE_LIMIT_S = 600.0

POINTS: dict[str, str] = {
    "after_plan": "the epoch's ranges are in the ledger; no Spark job has started",
    "task_mid_read": "a Spark task has read half of its range (Python worker)",
    "task_after_stage": "a Spark task wrote its rows to the sink's staging; it has not pre-committed",
    "task_after_precommit": "a Spark task pre-committed; its committable has not reached the driver",
    "slice_after_tasks": "the driver holds every task's committable; none is registered in the ledger",
    "slice_after_precommits": "the driver registered the slice's pre-commits; it has not exited",
    "before_decision": "the coordinator is about to decide",
    "after_decision": "the decision to commit is durable; no participant is committed",
    "participant_committed": "a sink committed its participants; the ledger does not know it yet",
    "between_commits": "one sink's participants are committed, the next sink's are not",
    "before_complete": "every participant is committed; the epoch is not marked COMMITTED",
    "during_abort": "the abort began; participants are not rolled back yet",
    "during_recover": "recovery found the epoch in flight and has not finished it",
    "kafka.produced": "the Kafka sink produced the staged records inside its open transaction",
    "kafka.offsets_sent": "the Kafka sink added the input offsets to its open transaction",
    "kafka.committed": "the Kafka sink's transaction is committed; its staging is not deleted",
    "wal.pushed": "the write-ahead-log sink pushed its rows; its log is not deleted",
    "files.logged": "the files sink put the epoch's log entry in the bucket; its markers are not deleted",
}


def armed() -> list[str]:
    """The points ``ONCEFLOW_CRASH_AT`` arms, checked against `POINTS`."""
    names = [n.strip() for n in os.environ.get(CRASH_AT_ENV, "").split(",") if n.strip()]
    unknown = [n for n in names if n not in POINTS]
    if unknown:
        raise ConfigError(f"{CRASH_AT_ENV}: unknown crash points {unknown}; known: {', '.join(POINTS)}")
    return names


def plan_armed(env: dict[str, str] | None = None) -> bool:
    """Whether any crash or pause point is armed (a test's switch, read here where the points act)."""
    environ = os.environ if env is None else env
    return bool(environ.get(CRASH_AT_ENV, "").strip() or environ.get(PAUSE_AT_ENV, "").strip())


def crash_point(name: str) -> None:
    """SIGKILL this process if ``name`` is armed (and, with a state folder, if this is the chosen hit).

    Or pause here, if ``name`` is armed with ``ONCEFLOW_PAUSE_AT``.
    """
    if os.environ.get(PAUSE_AT_ENV) == name:
        _pause(name)
    if not os.environ.get(CRASH_AT_ENV):
        return
    if name not in POINTS:
        raise ValueError(f"crash_point({name!r}) is not declared in onceflow.faults.POINTS")
    if name not in armed():
        return
    state = os.environ.get(CRASH_STATE_ENV)
    if state:
        folder = Path(state)
        skip = int(os.environ.get(CRASH_SKIP_ENV, "0") or 0)
        if _claim_hit(folder, name) != skip + 1:
            return
        (folder / f"crashed-{name}").write_text(f"{os.getpid()}\n")
    print(f"[onceflow] crash point {name!r}: SIGKILL of pid {os.getpid()}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _pause(name: str) -> None:
    folder = Path(os.environ.get(PAUSE_DIR_ENV) or ".")
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder / f"paused-{name}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # another hit paused already: only the first one waits
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    print(f"[onceflow] pause point {name!r}: pid {os.getpid()} waits for resume", file=sys.stderr, flush=True)
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not (folder / f"resume-{name}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def crashed(state: str | os.PathLike[str], name: str) -> bool:
    """Whether a run with ``ONCEFLOW_CRASH_STATE=state`` really crashed at ``name``."""
    return (Path(state) / f"crashed-{name}").exists()


def _claim_hit(folder: Path, name: str) -> int:
    """The number of this hit of ``name`` across every process sharing ``folder`` (1, 2, ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    number = 1
    while True:
        try:
            fd = os.open(folder / f"hit-{name}-{number}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            number += 1
            continue
        os.close(fd)
        return number
