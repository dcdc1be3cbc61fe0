"""``onceflow run --follow``: one long-lived runner that plans the next epoch as soon as the last commits.

An epoch started by a new process pays for the interpreter, the pipeline's imports, joining the Spark
Connect session and shipping its modules; a follower pays once and then only for the epoch itself, which
is what a freshness of about a second needs. Between epochs it asks Kafka (and the ledger) whether
anything new arrived, every ``poll_s``, without planning empty epochs that would only fill the ledger.

It stops on SIGTERM or SIGINT between two epochs: the epoch in flight first commits (or aborts on a
failure of its slices), so a stop leaves nothing in doubt and nothing for ``recover``. A second signal
is not caught: the process dies as it would without the handler, and the next runner's recovery finishes
or rolls back what it left, as after any crash.

An epoch that fails (aborted, its ranges replayed by the next) is reported and retried after a pause
that doubles up to a minute; ``max_failures`` failures in a row end the follower with the last one.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from onceflow.config import Settings
from onceflow.engine.executors import Executor
from onceflow.engine.runner import ProcessFailed, epoch_line, run_epoch
from onceflow.ledger import Ledger
from onceflow.logs import Log, quiet
from onceflow.pipeline import load_pipeline
from onceflow.protocol.coordinator import Coordinator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
MAX_PAUSE_S = 60.0


@contextmanager
def stop_on_signals(stop: threading.Event, progress: Log) -> Iterator[None]:
    """Turn the first SIGTERM/SIGINT into ``stop``; the handlers are put back for a second one."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only; a caller elsewhere stops by setting ``stop``
        return
    saved = {number: signal.getsignal(number) for number in STOP_SIGNALS}

    def handle(number: int, _frame: FrameType | None) -> None:
        progress(f"{signal.Signals(number).name}: stopping after the epoch in flight")
        stop.set()
        for restored, handler in saved.items():
            signal.signal(restored, handler)

    for number in STOP_SIGNALS:
        signal.signal(number, handle)
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


def has_new_records(coordinator: Coordinator, max_records_per_partition: int | None) -> bool:
    """Whether the next epoch would read anything (an epoch left in flight counts: its ranges do)."""
    plan, _ = coordinator.preview(max_records_per_partition=max_records_per_partition)
    return plan.span > 0


def follow(
    pipeline_path: str,
    settings: Settings,
    *,
    executor: Executor | None = None,
    max_records_per_partition: int | None = None,
    poll_s: float = 0.2,
    max_failures: int = 5,
    stop: threading.Event | None = None,
    log: Log = quiet,
    progress: Log = quiet,
) -> int:
    """Run epochs until ``stop`` is set (or a stop signal arrives); returns how many committed."""
    stop = stop or threading.Event()
    spec = load_pipeline(pipeline_path)
    committed = failures = 0
    with stop_on_signals(stop, progress), Ledger.connect(settings.ledger_url) as ledger:
        watcher = Coordinator.for_pipeline(spec, ledger, settings, log=log)
        progress(f"following {spec.name!r}: an epoch as soon as new records arrive; SIGTERM stops")
        while not stop.is_set():
            if not has_new_records(watcher, max_records_per_partition):
                stop.wait(poll_s)
                continue
            try:
                outcome = run_epoch(
                    pipeline_path,
                    settings,
                    max_records_per_partition=max_records_per_partition,
                    executor=executor,
                    log=log,
                )
            except ProcessFailed as exc:
                failures += 1
                if failures >= max_failures:
                    raise
                pause = min(MAX_PAUSE_S, 2.0 ** (failures - 1))
                progress(f"{exc} (failure {failures} of {max_failures} in a row; next try in {pause:g} s)")
                stop.wait(pause)
                continue
            failures = 0
            committed += 1
            progress(epoch_line(outcome))
    progress(f"stopped after {committed} committed epoch(s); nothing is in flight")
    return committed
