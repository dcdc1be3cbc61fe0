"""Spark's own faults, landed while an epoch's tasks run on the warm runtime.

The crash and pause points of a driver step cannot reach the warm runtime's tasks: they run in the
executors the Connect server keeps, which do not inherit the step's environment. So these faults are
aimed by Spark itself: the step runs in the background, and the fault lands as soon as Spark's REST API
shows a task of it running (the soak runs one epoch at a time, so a running task is that epoch's). An
epoch that finishes before any task is seen is a fault that did not land, and says so.

The runtime's footprint, which the soak samples between faults, is `local_stack.footprint`'s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
from local_stack.footprint import daemons, python_workers
from local_stack.spark_runtime import WORKERS, SparkRuntime

# Kinds of the soak's catalogue, each one a process of the path users run, SIGKILLed mid-task.
SPARK_KINDS = ("spark_executor", "spark_python_worker", "spark_connect", "spark_worker", "runner_lease")
DESCRIBED = {
    "spark_executor": "an executor JVM SIGKILLed mid-task",
    "spark_python_worker": "the executors' Python workers SIGKILLed mid-batch",
    "spark_connect": "the Spark Connect server SIGKILLed mid-epoch and restarted",
    "spark_worker": "standalone worker-1 lost (worker, executor, Python workers SIGKILLed) and back",
    "runner_lease": "the epoch's runner SIGKILLed mid-task while it holds the lease",
}


def forked_workers(runtime: SparkRuntime) -> list[psutil.Process]:
    """The Python workers running batches: the children of each executor's daemon."""
    processes = python_workers(runtime)
    forking = {p.pid for p in daemons(runtime, processes)}
    return [p for p in processes if _parent(p) in forking]


def _parent(process: psutil.Process) -> int | None:
    try:
        return process.ppid()
    except psutil.Error:
        return None


def _kill(pids: list[int]) -> list[int]:
    killed = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            continue
    return killed


def wait_for_task(runtime: SparkRuntime, step: subprocess.Popen[str], timeout: float = 300) -> bool:
    """True once a task runs on the runtime; False when the step ended first (the fault cannot land)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and step.poll() is None:
        if runtime.active_tasks() > 0:
            return True
        time.sleep(0.03)
    return False


def strike(kind: str, runtime: SparkRuntime, step: subprocess.Popen[str]) -> str:
    """SIGKILL what ``kind`` names, now; returns what was killed. The caller restarts what must come back
    (`SparkRuntime.start`) after the step has ended, as an operator's supervisor would."""
    if kind == "spark_executor":
        busy = [e["id"] for e in runtime.rest("executors") if e["id"] != "driver" and e["activeTasks"]]
        victims = [pid for pid in runtime.executor_pids() if _executor_id(pid) in busy][:1]
    elif kind == "spark_python_worker":
        victims = [p.pid for p in forked_workers(runtime)]
    elif kind == "spark_connect":
        victims = [pid for pid in (runtime.pid("connect"),) if pid]
    elif kind == "spark_worker":
        worker = runtime.pid(WORKERS[0])
        below = psutil.Process(worker).children(recursive=True) if worker else []
        victims = [pid for pid in (worker, *(p.pid for p in below)) if pid]
    elif kind == "runner_lease":
        victims = [step.pid]
    else:
        raise ValueError(f"unknown Spark fault kind {kind!r}; expected one of {SPARK_KINDS}")
    killed = _kill(victims)
    return f"{len(killed)} process(es) SIGKILLed" if killed else "nothing to kill"


def _executor_id(pid: int) -> str | None:
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        return None
    return cmdline[cmdline.index("--executor-id") + 1] if "--executor-id" in cmdline else None
