"""The warm Spark runtime's memory footprint, and whether a curve of it stays flat.

The soak and the bench both watch the same thing, so they share this one definition: the proportional
set size (PSS, each shared page split between the processes that map it, so that forked Python workers
are not counted once per fork) of every runtime process by role, its Python processes (each executor's
``pyspark.daemon`` and the workers it forked) and the Connect sessions the server holds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from local_stack.spark_runtime import WORKERS, SparkRuntime

SESSIONS = re.compile(r"(\d+)\s+session\(s\) are online")
# Roles that are JVMs; "python" holds every Python process under the executors.
JVM_ROLES = ("master", *WORKERS, "connect", "executors")


@dataclass
class Footprint:
    """The runtime at one moment: PSS in MB per role, Python processes (daemons among them), sessions."""

    pss_mb: dict[str, float]
    python_processes: int
    sessions: int
    python_daemons: int = -1
    executors: int = -1  # executor processes (on a lean runtime, the Connect server)

    @property
    def total_mb(self) -> float:
        return round(sum(self.pss_mb.values()), 1)

    @property
    def jvm_mb(self) -> float:
        return round(sum(mb for role, mb in self.pss_mb.items() if role in JVM_ROLES), 1)


def pss_mb(pid: int) -> float:
    """Proportional set size of one process (``/proc/PID/smaps_rollup``), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return 0.0
    return 0.0


def python_workers(runtime: SparkRuntime) -> list[psutil.Process]:
    """The Python processes under the executors: each executor's ``pyspark.daemon`` and the workers it
    forked (a forked worker keeps the daemon's command line, so depth tells them apart, not the name)."""
    found: list[psutil.Process] = []
    for pid in runtime.executor_pids():
        try:
            found += psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            continue
    return [p for p in found if _alive(p)]


def _alive(process: psutil.Process) -> bool:
    """Not exited: a zombie (a child that ended and that its JVM has not reaped yet) holds no memory and
    runs nothing."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _parent(process: psutil.Process) -> int | None:
    try:
        return process.ppid()
    except psutil.Error:
        return None


def daemons(runtime: SparkRuntime, processes: Sequence[psutil.Process]) -> list[psutil.Process]:
    """Of ``processes``, the executors' direct children: one ``pyspark.daemon`` per Python worker
    factory (with ``spark.python.use.daemon=false``, the workers themselves)."""
    executors = set(runtime.executor_pids())
    return [p for p in processes if _parent(p) in executors]


def footprint(runtime: SparkRuntime, sessions: Callable[[SparkRuntime], int] | None = None) -> Footprint:
    roles: dict[str, float] = {}
    for name in ("master", *WORKERS, "connect"):
        if (pid := runtime.pid(name)) is not None:
            roles[name] = pss_mb(pid)
    server = runtime.pid("connect")  # on a lean runtime, the executor too: counted once, as "connect"
    executors = runtime.executor_pids()
    roles["executors"] = round(sum(pss_mb(pid) for pid in executors if pid != server), 1)
    workers = python_workers(runtime)
    roles["python"] = round(sum(pss_mb(p.pid) for p in workers), 1)
    return Footprint(
        roles,
        len(workers),
        (sessions or connect_sessions)(runtime),
        len(daemons(runtime, workers)),
        len(executors),
    )


@dataclass(frozen=True)
class Collector:
    """What the JVMs' garbage collectors have done since they started, from ``jstat -gc``: a heap that
    fills to its cap does not grow, so memory alone cannot see it; the time spent collecting can."""

    gc_s: float
    full_gcs: int
    old_used_mb: float
    old_capacity_mb: float

    @property
    def old_used(self) -> float:
        """The old generation's fill, 0 to 1."""
        return self.old_used_mb / self.old_capacity_mb if self.old_capacity_mb else 0.0


def collector(pids: Sequence[int]) -> Collector | None:
    """The JVMs in ``pids`` summed; None when ``jstat`` is missing (a JRE has none) or a JVM does not
    answer, so that a probe that could not tell is never read as a quiet collector."""
    jstat = shutil.which("jstat")
    if jstat is None or not pids:
        return None
    found: list[dict[str, float]] = []
    for pid in pids:
        try:
            out = subprocess.run([jstat, "-gc", str(pid)], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        lines = out.stdout.split("\n")
        if out.returncode != 0 or len(lines) < 2:
            return None
        try:  # a collector without a concurrent phase (serial, parallel) prints "-" for it
            found.append(dict(zip(lines[0].split(), map(_number, lines[1].split()), strict=True)))
        except ValueError:
            return None
    return Collector(
        gc_s=round(sum(row["GCT"] for row in found), 2),
        full_gcs=int(sum(row["FGC"] for row in found)),
        old_used_mb=round(sum(row["OU"] for row in found) / 1024, 1),
        old_capacity_mb=round(sum(row["OC"] for row in found) / 1024, 1),
    )


def _number(cell: str) -> float:
    return 0.0 if cell == "-" else float(cell)


def connect_sessions(runtime: SparkRuntime) -> int:
    """Sessions the Connect server holds, from its UI page (the REST API does not list them); -1 when the
    page does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{runtime.ui_port}/connect/", timeout=5) as page:
            found = SESSIONS.search(page.read().decode("utf-8", "replace"))
    except OSError:
        return -1
    return int(found.group(1)) if found else -1


# ------------------------------------------------------------------------------------------ flatness

# A curve is flat when its second half peaks at most FLAT_FACTOR times its first half's peak plus a
# margin: JVM heaps settle over the first minutes, and Python workers come and go with the tasks in flight.
FLAT_FACTOR = 1.25
FLAT_MARGINS = {"total_mb": 300.0, "python_processes": 4.0}


@dataclass(frozen=True)
class Growth:
    """A curve's peak in each half of a run, and the most its second half may reach to count as flat:
    ``factor`` times the first half's peak plus ``margin``. A plateau or a sawtooth passes; steady growth
    fails however long the run, since the second half then ends well above the first."""

    first_half_peak: float
    second_half_peak: float
    limit: float

    @property
    def flat(self) -> bool:
        return self.second_half_peak <= self.limit


def halves_growth(values: Sequence[float], factor: float, margin: float) -> Growth | None:
    """The `Growth` of a curve split at its middle sample; None when a half has no value (NaN is a
    probe that could not tell, and is left out)."""
    middle = len(values) // 2
    early = [v for v in values[:middle] if v == v]
    late = [v for v in values[middle:] if v == v]
    if not early or not late:
        return None
    return Growth(max(early), max(late), max(early) * factor + margin)
