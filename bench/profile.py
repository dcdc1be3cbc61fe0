"""Where the files pipeline's time goes: the CPU each part of the machine spends during one run, and,
with py-spy on the PATH, how the Python workers spend theirs (``--steps profile``).

CPU comes from /proc: every process's user + system time at the start and the end of the run. The
runtime's Python workers are forked by a daemon that ignores SIGCHLD, so their time reaches no parent
when they exit: they are followed through the daemon's list of children every 20 ms, and each counts
with the last time seen (a worker lives for its task, a second or more, so the part lost after the last
look is small). The bench's own process counts as one part: it is the slice's driver and the
coordinator, and it also runs the bench's memory sampler.

py-spy samples the workers in a second run (its own cost would blur the first's figures), and each
sample is put in the first part of `WORKER_PARTS` whose frames it holds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

DAEMON = "python daemon"
WORKERS = "python workers"
# (part, the command-line words that give a process to it), first match wins.
ROLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the runtime's JVM (Spark Connect server, executors)", ("SparkConnectServer", "CoarseGrainedExecutor")),
    ("Kafka broker", ("kafka.Kafka",)),
    (DAEMON, ("python_daemon", "pyspark.daemon")),
    ("PostgreSQL", ("postgres",)),
)
# The workers' parts, in the order a sample is tried against them: (part, frame names).
WORKER_PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("read: the Kafka fetch (consume, one pass each for errors and offsets)", ("read_range_batches",)),
    ("read: Arrow's JSON reader over a batch, with its checks", ("NativeJsonDecoder", "_lines_are_records")),
    ("read: record by record (batches Arrow's reader left)", ("RowDecoder",)),
    ("read: the batch's Kafka columns", ("BatchDecoder.decode", "read_task_batches")),
    ("read: Arrow batches out to the JVM", ("python_read",)),
    ("write: Parquet encoding and writing", ("ParquetWriter", "write_table")),
    ("write: Arrow batches in from the JVM", ("load_stream", "RecordBatchStreamReader")),
    ("write: the sink's steps (begin, pre-commit, checksum, fsync)", ("write_task_sinks", "sinks_task")),
    ("start-up: imports, the task's function", ("_find_and_load", "read_command", "read_udfs")),
    ("pyspark's worker loop", ("worker (pyspark/daemon.py",)),
)
DAEMON_PART = "the daemon (forking the workers)"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _role(pid: int, driver: int) -> str:
    if pid == driver:
        return "the bench's process (slice driver, coordinator, samplers)"
    words = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    for role, marks in ROLES:
        if any(mark in words for mark in marks):
            return role
    return "other"


class CpuByPart:
    """Samples every process's CPU while the context runs (see the module); `parts` then holds the CPU
    seconds of each part and `workers` how many workers were seen."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self.workers = 0
        self._stop = threading.Event()

    @contextlib.contextmanager
    def sampling(self) -> Iterator[CpuByPart]:
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        roles: dict[int, str] = {}
        workers: dict[int, tuple[float, float]] = {}
        driver = os.getpid()

        def look(pid: int, started: bool) -> None:
            try:
                cpu = _cpu_s(pid)
                roles.setdefault(pid, _role(pid, driver))
            except OSError:
                return
            first.setdefault(pid, 0.0 if started else cpu)  # a process that starts later spent from 0
            last[pid] = cpu

        def run() -> None:
            started, all_at = False, 0.0
            while not self._stop.is_set():
                if time.monotonic() - all_at >= 0.5:
                    all_at = time.monotonic()
                    for name in os.listdir("/proc"):
                        if name.isdigit() and int(name) not in workers:
                            look(int(name), started)
                    started = True
                for daemon in [pid for pid, role in roles.items() if role == DAEMON]:
                    with contextlib.suppress(OSError):
                        for child in map(
                            int, Path(f"/proc/{daemon}/task/{daemon}/children").read_text().split()
                        ):
                            with contextlib.suppress(OSError):
                                cpu = _cpu_s(child)
                                workers[child] = (
                                    workers.get(child, (cpu if not started else 0.0, 0.0))[0],
                                    cpu,
                                )
                self._stop.wait(0.02)

        thread = threading.Thread(target=run, name="cpu-by-part", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()
            for pid, cpu in last.items():
                if pid not in workers:
                    self.parts[roles[pid]] = self.parts.get(roles[pid], 0.0) + cpu - first[pid]
            self.parts[WORKERS] = sum(end - start for start, end in workers.values())
            self.workers = len(workers)


@contextlib.contextmanager
def py_spy(out: Path) -> Iterator[Callable[[], bool]]:
    """py-spy recording the runtime's Python workers (attached to the first daemon that has a child)
    while the context runs; the context gives a function that says whether it attached."""
    attached: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()

    def attach() -> None:
        while not stop.is_set() and not attached:
            for name in os.listdir("/proc"):
                with contextlib.suppress(OSError, ValueError):
                    pid = int(name)
                    words = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if (
                        b"python_daemon" in words
                        and Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                    ):
                        command = ["py-spy", "record", "--pid", str(pid), "--subprocesses", "--format", "raw"]
                        attached.append(
                            subprocess.Popen(
                                [*command, "--rate", "25", "--output", str(out)],
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                            )
                        )
                        return
            stop.wait(0.05)

    thread = threading.Thread(target=attach, name="py-spy-attach", daemon=True)
    thread.start()
    try:
        yield lambda: bool(attached)
    finally:
        stop.set()
        thread.join()
        for process in attached:
            process.send_signal(signal.SIGINT)  # py-spy writes its samples when interrupted
            process.wait(timeout=60)


def worker_shares(raw: Path) -> dict[str, float]:
    """Each worker part's share of py-spy's samples (``--format raw``: one stack and its count a line)."""
    counts: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        frames = stack.split(";")
        part = next(
            (
                name
                for name, marks in WORKER_PARTS
                if any(mark in frame for frame in frames for mark in marks)
            ),
            DAEMON_PART,
        )
        counts[part] = counts.get(part, 0) + int(number)
    total = sum(counts.values()) or 1
    return {part: count / total for part, count in sorted(counts.items(), key=lambda kv: -kv[1])}


def measure(
    run: Callable[[], dict[str, Any]], records: int, workdir: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    """``run`` (one files pipeline run over ``records``, as a round stores it) twice: with the CPU
    sampler, then under py-spy when it is on the PATH."""
    sampler = CpuByPart()
    started = time.perf_counter()
    with sampler.sampling():
        first = run()
    wall = time.perf_counter() - started
    out: dict[str, Any] = {
        "records": records,
        "records_per_s": first["records_per_s"],
        "wall_s": wall,
        "cores": os.cpu_count(),
        "cpu_s": sampler.parts,
        "workers": sampler.workers,
    }
    say(f"profile: {first['records_per_s']:,.0f} records/s, CPU s by part {sampler.parts}")
    if shutil.which("py-spy") is None:
        say("profile: py-spy is not on the PATH (pip install py-spy): the workers' parts are not measured")
        return out
    raw = workdir / "py-spy-workers.txt"
    with py_spy(raw) as attached:
        run()
    if attached() and raw.exists():
        out["worker_shares"] = worker_shares(raw)
        say(f"profile: the workers' parts {out['worker_shares']}")
    return out
