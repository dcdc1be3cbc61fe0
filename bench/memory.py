"""Peak memory of a process tree (a spark-submit and its JVM and Python workers), sampled.

Memory is the proportional set size (PSS): each page shared between processes counts once, split between
them. Resident sizes would count a forked Python worker's pages shared with its daemon once per worker.
In Spark's local mode the driver JVM also hosts the executors (as threads), and each executor core runs
Python code in forked ``pyspark.daemon`` workers; the peak is split into those two parts and the driver's
own Python process, so that a leak in any of them shows.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import psutil
from local_stack.footprint import pss_mb

# A sample reads each process's /proc/PID/smaps_rollup, which costs a JVM's mappings: 4 a second.
INTERVAL_S = 0.25
MEASURE = "pss"


@dataclass
class TreePeak:
    """Peak PSS in MB, as the largest sum seen in one sample (not the sum of each part's peak)."""

    total_mb: float = 0.0
    jvm_mb: float = 0.0
    python_workers_mb: float = 0.0
    driver_python_mb: float = 0.0
    samples: int = 0

    def merge(self, other: TreePeak) -> None:
        self.total_mb = max(self.total_mb, other.total_mb)
        self.jvm_mb = max(self.jvm_mb, other.jvm_mb)
        self.python_workers_mb = max(self.python_workers_mb, other.python_workers_mb)
        self.driver_python_mb = max(self.driver_python_mb, other.driver_python_mb)
        self.samples += other.samples


def _kind(process: psutil.Process) -> str:
    try:
        name = process.name()
        cmdline = " ".join(process.cmdline())
    except psutil.Error:
        return "other"
    if name == "java" or "java" in name:
        return "jvm"
    if "pyspark.daemon" in cmdline or "pyspark/daemon" in cmdline or "pyspark.worker" in cmdline:
        return "python_workers"
    if "python" in name:
        return "driver_python"
    return "other"


@dataclass
class TreeSampler:
    """Samples the summed PSS of ``pid``'s descendants (not ``pid`` itself) every INTERVAL_S until `stop()`.

    Pointed at the benchmark's own pid, it measures whatever child it starts (e.g. ``submit_slice``'s
    spark-submit) without changing how the child is started.
    """

    pid: int
    # Processes sampled with their descendants, themselves included: the warm Spark runtime's (its
    # Connect server, its workers and their executors) and, as the slice's driver, this process.
    also: tuple[int, ...] = ()
    peak: TreePeak = field(default_factory=TreePeak)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> TreeSampler:
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> TreePeak:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.peak

    def _run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            self._sample(root)
            self._stop.wait(INTERVAL_S)

    def _sample(self, root: psutil.Process) -> None:
        parts = {"jvm": 0.0, "python_workers": 0.0, "driver_python": 0.0, "other": 0.0}
        try:
            processes = root.children(recursive=True)
        except psutil.Error:
            return
        for pid in self.also:
            try:
                other = psutil.Process(pid)
                processes += [other, *other.children(recursive=True)]
            except psutil.Error:
                continue
        for process in dict.fromkeys(processes):  # a runtime process is also a child of another one
            parts[_kind(process)] += pss_mb(process.pid)
        self.peak.merge(
            TreePeak(
                total_mb=sum(parts.values()),
                jvm_mb=parts["jvm"],
                python_workers_mb=parts["python_workers"],
                driver_python_mb=parts["driver_python"],
                samples=1,
            )
        )
