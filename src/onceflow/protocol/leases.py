"""An owner's heartbeat: renew a lease in the background while a block of work runs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from onceflow.logs import Log


@contextmanager
def renewing(renew: Callable[[], bool], period_s: float, log: Log, what: str) -> Iterator[None]:
    """Call ``renew`` every ``period_s`` (at least every half second) until the block ends or it
    returns False (the leased thing is final); a failed renewal is one line, and the next beat retries,
    since a ledger hiccup must not end a runner's work."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(max(period_s, 0.5)):
            try:
                if not renew():
                    return
            except Exception as exc:
                log(f"renewal of the {what} failed ({exc}); retrying")

    thread = threading.Thread(target=beat, name=f"onceflow-{what.replace(' ', '-')}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
