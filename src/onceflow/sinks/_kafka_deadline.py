"""Deadlines on the Kafka sink's broker calls, and the closing of a commit's producer once no call uses it.

A call that outlives its deadline is abandoned in its worker thread (see `within` for why), and the
producer it still holds is closed only when it returns (`ProducerOwner`). Used by the committer only;
confluent_kafka is imported when a call is made.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from onceflow.sinks.errors import SinkError

if TYPE_CHECKING:
    from confluent_kafka import Producer

KIND = "kafka"
# How long past ``timeout_s`` a broker call may run before the sink stops waiting for it.
TIMEOUT_MARGIN_S = 5.0

T = TypeVar("T")


class KafkaUnreachable(SinkError):
    """A broker call of the commit got no answer within ``timeout_s``: the commit fails, to be retried."""


def within(
    what: str, bootstrap: str, timeout_s: float, call: Callable[[], T], done: Callable[[], None] | None = None
) -> T:
    """``call()``, or `KafkaUnreachable` once ``timeout_s`` (plus a margin) has passed.

    librdkafka honours its own timeouts except where a request waits for a coordinator that is down:
    ``send_offsets_to_transaction`` then blocks until the broker comes back, whatever its timeout
    (librdkafka issue 5456), which held a decided epoch, and its prepared transactions, for as long as
    the broker was dead. So each call runs in a worker thread that is abandoned at the deadline; it holds
    the producer, whose open transaction the next ``init_transactions`` of the same id aborts.

    ``done`` runs exactly once, after ``call`` has ended: here when it ended in time, else in the
    abandoned worker when it finally returns. What the call uses (the producer) is so released once
    the call is over, never under a call still running, and not left behind either.
    """
    from confluent_kafka import KafkaError, KafkaException

    outcome: list[Any] = []
    lock = threading.Lock()
    abandoned: list[bool] = []

    def run() -> None:
        result: tuple[bool, Any]
        try:
            result = (True, call())
        except BaseException as exc:  # handed to the caller's thread
            result = (False, exc)
        with lock:
            outcome.append(result)
            late = bool(abandoned)
        if late and done is not None:
            done()

    worker = threading.Thread(target=run, name=f"kafka-sink-{what}", daemon=True)
    worker.start()
    worker.join(timeout_s + TIMEOUT_MARGIN_S)
    with lock:
        timed_out = not outcome
        if timed_out:
            abandoned.append(True)
    if not timed_out and done is not None:
        done()
    if outcome and not outcome[0][0]:
        exc = outcome[0][1]
        error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        if not (isinstance(error, KafkaError) and error.code() == KafkaError._TIMED_OUT):
            raise exc
        timed_out = True
    if timed_out:
        raise KafkaUnreachable(
            f"{KIND} sink: {what} got no answer from {bootstrap} within {timeout_s:g} s (sink setting "
            "timeout_s); the epoch stays decided, and the next commit or recover completes the slice once "
            "Kafka answers"
        )
    return outcome[0][1]  # type: ignore[no-any-return]


class ProducerOwner:
    """Closes a commit's producer once, when nothing uses it any more: when the commit is over, or, if
    a broker call outlived its deadline (see `within`), when the last such call returns. Closing sooner
    would pull the producer from under a call still running; not closing leaked its threads, sockets
    and buffers for every slice committed."""

    def __init__(self, producer: Producer, bootstrap: str, timeout_s: float) -> None:
        self._producer = producer
        self._bootstrap = bootstrap
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._users = 1  # the commit itself, released when it is over

    def hold(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            # close() aborts a transaction still open and flushes: bounded too, and a failure to close
            # a producer whose work is over is no failure of the commit.
            with contextlib.suppress(Exception):
                within("close", self._bootstrap, self._timeout_s, self._producer.close)
