"""A slice run in this process (the local executor, a Spark Connect client) ends by its deadline.

spark-submit slices are killed past the pipeline's ``transaction_timeout_s`` (`submit.submit_slice`) and a
DAG's process tasks get it as their ``execution_timeout``. A slice run in the caller's own process needs
the same bound, or a hung slice would keep its epoch's lease renewed, and its transactions open, for
ever. Python cannot kill a thread: the slice runs in a daemon thread that the caller stops waiting for at
the deadline, after asking it to stop (a Spark Connect slice's queries are interrupted). The caller then
aborts the epoch, so whatever the abandoned slice does later is refused by the ledger (a zombie of an
aborted epoch, invariant 3), and rolls back its own staging, or the sweeper does.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from onceflow.engine.failures import failure_line
from onceflow.engine.submit import SliceTimedOut

T = TypeVar("T")


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
