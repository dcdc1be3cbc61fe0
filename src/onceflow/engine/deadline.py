"""A slice run in this process (the local executor, a Spark Connect client) ends by its deadline.

spark-submit slices are killed past the pipeline's ``transaction_timeout_s`` (`submit.submit_slice`) and a
DAG's process tasks get it as their ``execution_timeout``. A slice run in the caller's own process needs
the same bound, or a hung slice would keep its epoch's lease renewed, and its transactions open, for
ever.

* A **local** slice is plain Python, and Python cannot kill a thread: it runs in a daemon thread that
  the caller stops waiting for at the deadline (`within`). The caller then aborts the epoch, so whatever
  the abandoned slice does later is refused by the ledger (a zombie of an aborted epoch, invariant 3),
  and rolls back its own staging, or the sweeper does.
* A **Spark Connect** slice stays on the caller's thread, where its session lives (pyspark keeps the
  active session per thread, and a session the server closed is joined again there); a watchdog
  (`watched`) interrupts its queries at the deadline, which ends the slice with their failure.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from onceflow.engine.failures import failure_line
from onceflow.engine.submit import SliceTimedOut

T = TypeVar("T")


def watched(seconds: float, what: str, work: Callable[[], T], on_expiry: Callable[[], None]) -> T:
    """``work()`` on this thread, with ``on_expiry`` called from a watchdog if it is still running after
    ``seconds``; then its failure, whatever it is, is `SliceTimedOut` in one line."""
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        try:
            on_expiry()
        except Exception as exc:  # the timeout is the failure that matters
            print(f"[onceflow] could not stop {what} ({failure_line(exc)})", file=sys.stderr, flush=True)

    watchdog = threading.Timer(seconds, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        result = work()
    except Exception as exc:
        if expired.is_set():
            raise SliceTimedOut(_past(what, seconds)) from exc
        raise
    finally:
        watchdog.cancel()
    if expired.is_set():  # it ended on its own, just after its deadline: still past it
        raise SliceTimedOut(_past(what, seconds))
    return result


def _past(what: str, seconds: float) -> str:
    return (
        f"{what} ran past the pipeline's transaction timeout ({seconds:g} s) and was stopped; "
        "the epoch is aborted and replayed"
    )


def within(
    seconds: float, what: str, work: Callable[[], T], *, on_expiry: Callable[[], None] | None = None
) -> T:
    """``work()``'s result or exception, if it ends within ``seconds``; else `SliceTimedOut`, in one line,
    once ``on_expiry`` (if any) was called. ``what`` names the work in that line."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # carried to the caller, or said once abandoned
            failure.append(exc)
            if abandoned.is_set():
                print(
                    f"[onceflow] {what}, abandoned at its deadline, ended: {failure_line(exc)}",
                    file=sys.stderr,
                    flush=True,
                )

    abandoned = threading.Event()
    thread = threading.Thread(target=run, name=f"onceflow {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        abandoned.set()
        if on_expiry is not None:
            try:
                on_expiry()
            except Exception as exc:  # the timeout is the failure that matters
                print(f"[onceflow] could not stop {what} ({failure_line(exc)})", file=sys.stderr, flush=True)
        raise SliceTimedOut(
            f"{what} ran past the pipeline's transaction timeout ({seconds:g} s) and was abandoned; "
            "the epoch is aborted and replayed"
        )
    if failure:
        raise failure[0]
    return outcome[0]
