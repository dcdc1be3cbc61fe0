"""pyspark's Python daemon, which exits once it has had no worker for a while (SPARK-54055).

Spark 4.1 gives every Spark Connect session that runs Python a Python worker factory of its own on each
executor, with its own ``pyspark.daemon``, and keeps it until the executor stops; onceflow joins one
session per pipeline and modules, so a runtime that has seen N pipelines holds 2N daemons (about 43 MB
each) for ever. The runtime's workers exit with their task (``spark.python.worker.reuse false``, where
Spark would keep idle ones a minute); this daemon then exits on its own once it has had no forked
worker for ``ONCEFLOW_PYTHON_DAEMON_IDLE_S`` seconds (default `IDLE_S`). The factory starts a new
daemon at its next task: connecting to the one that exited fails with a ``SocketException``, on which
Spark stops the old daemon, starts another and connects again.

Before anything of pyspark is imported, it also takes off its path the archives that Spark puts first on
every Python worker's path (`spark_archives`) where the same pyspark is installed: each task's worker calls
``importlib.invalidate_caches()``, which in CPython 3.11 reads again the whole directory of every archive
that a module was imported from, once per package (16 of them, 0.12 s a call, two calls in most tasks).

The check runs in the daemon's own main thread, from a SIGALRM timer (no thread, so that its forks stay
safe), between two steps of the daemon's loop: never while it forks a worker, and it leaves a
connection that already waits to be accepted to the loop. The runtime selects it with
``spark.python.daemon.module=onceflow.engine.python_daemon`` (infra/spark/connect-server.conf).
"""

from __future__ import annotations

import gc
import importlib
import importlib.machinery
import os
import select
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType

from onceflow.config import python_daemon_idle_s

IDLE_S = 30.0
CHECK_S = 10.0
# Imported once in the daemon, before it forks: every worker then shares these modules' pages with it
# (copy on write) instead of importing them again into memory of its own, about 60 MB a worker.
PRELOADED = (
    "pyarrow",
    "pyarrow.parquet",
    "pandas",
    "confluent_kafka",  # the Python reader's consumer (imported where a range is read)
    "msgspec.json",  # the typed JSON decoder (imported where a JSON format's decoder is built)
    "pyarrow.json",  # Arrow's JSON reader, for the batches of flat JSON formats
    "onceflow.executor.reading",
    "onceflow.executor.rejected",
    "onceflow.executor.writing",
    # The sinks' writers, which each write task imports at its begin: PostgreSQL's (psycopg alone took
    # 64 ms a task), files' and Kafka's. Iceberg's (pyiceberg) is left to the tasks that need it.
    "psycopg",
    "pyarrow.csv",
    "pyarrow.pandas_compat",
    "onceflow.sinks.files",
    "onceflow.sinks.kafka",
    "onceflow.sinks.plain",
    "onceflow.sinks.postgres_2pc",
    "onceflow.sinks.postgres_upsert",
)


def _children(pid: int) -> int:
    """The live children of ``pid``'s main thread (the daemon forks from it); -1 when /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listed:
            return len(listed.read().split())
    except OSError:
        return -1


def _pending(frame: FrameType | None) -> bool:
    """Whether a connection waits on the daemon's listening socket (a worker about to be asked for),
    found in the frame of ``pyspark.daemon.manager`` that the signal interrupted."""
    while frame is not None:
        listening = frame.f_locals.get("listen_sock") if frame.f_code.co_name == "manager" else None
        if listening is not None:
            try:
                return bool(select.select([listening], [], [], 0)[0])
            except (OSError, ValueError):
                return True  # cannot tell: stay
        frame = frame.f_back
    return False


class IdleExit:
    """Counts the time without forked workers; past ``idle_s``, ends the daemon as SIGTERM would."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.pid = os.getpid()
        self.busy_at = time.monotonic()

    def due(self, children: int, now: float) -> bool:
        """Whether the daemon should exit, given its live children now; any child (or an unknown count)
        restarts the idle time."""
        if children != 0:
            self.busy_at = now
            return False
        return now - self.busy_at >= self.idle_s

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid:
            return  # a forked worker that was sent SIGALRM: not the daemon's timer
        if self.due(_children(self.pid), time.monotonic()) and not _pending(frame):
            print(f"onceflow: Python daemon {self.pid} idle for {self.idle_s:g} s, exiting", file=sys.stderr)
            os.kill(self.pid, signal.SIGTERM)  # the daemon's own handler: its shutdown, as Spark's stop


def _worker_defaults() -> None:
    """In a forked worker: SIGALRM back to its default, so that the daemon's check never runs there."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)


def preload(names: tuple[str, ...] = PRELOADED) -> list[str]:
    """Import ``names`` (those that import here; a worker imports the others itself), then freeze what
    exists so that no garbage collection in a worker writes to, and so copies, the shared pages."""
    loaded = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional module: the worker that needs it reports it
            continue
        loaded.append(name)
    gc.freeze()
    return loaded


def spark_archives(path: Sequence[str]) -> list[str]:
    """The archives on ``path`` (pyspark.zip, py4j's zip, Spark's core jar) that lie inside the pyspark
    package which imports from the rest of ``path``, with py4j: copies of installed code, safe to drop.
    None when pyspark or py4j imports only from an archive (a Spark distribution without the wheel)."""
    archives = [entry for entry in path if entry.endswith((".zip", ".jar")) and os.path.isfile(entry)]
    rest = [entry for entry in path if entry not in archives]
    installed = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    if not archives or installed is None or not installed.submodule_search_locations:
        return []
    if importlib.machinery.PathFinder.find_spec("py4j", rest) is None:
        return []
    home = os.path.realpath(next(iter(installed.submodule_search_locations))) + os.sep
    return [entry for entry in archives if os.path.realpath(entry).startswith(home)]


def drop_spark_archives() -> list[str]:
    """Take `spark_archives` off ``sys.path``, out of the importers Python keeps for it (the ones that
    ``importlib.invalidate_caches`` would ask to read their archive again) and out of the modules found in
    them; none once pyspark was imported, since its modules would then come from an archive."""
    if "pyspark" in sys.modules:
        return []
    dropped = spark_archives(sys.path)
    inside = tuple(archive + os.sep for archive in dropped)
    for archive in dropped:
        sys.path.remove(archive)
    for key in [k for k in sys.path_importer_cache if k in dropped or k.startswith(inside)]:
        del sys.path_importer_cache[key]
    # Namespace packages found in an archive so far (the standard library's ``copy`` looks for Jython's
    # ``org.python.core``, and Spark's jar has an ``org`` folder) would keep pointing into it.
    for name, module in list(sys.modules.items()):
        found_in = [getattr(module, "__file__", None) or "", *(getattr(module, "__path__", None) or ())]
        if any(str(place).startswith(inside) for place in found_in):
            del sys.modules[name]
    return dropped


def main() -> None:
    drop_spark_archives()
    from pyspark import daemon

    preload()
    idle_s = python_daemon_idle_s(IDLE_S)
    signal.signal(signal.SIGALRM, IdleExit(idle_s))
    os.register_at_fork(after_in_child=_worker_defaults)
    signal.setitimer(signal.ITIMER_REAL, min(CHECK_S, idle_s), min(CHECK_S, idle_s))
    daemon.manager()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
