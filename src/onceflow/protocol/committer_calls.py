"""One call of a sink's committer, with its outcome as Flink's ``CommitRequest`` has them.

A committer call is done (also when the committer finds its output committed already: commits are
idempotent), asks to be retried later (`RetryLater`: called again after a pause, then left to the next
step), failed for a reason it knows and no retry mends (`KnownFailure`: one line for a human, and the
doors do not retry), or failed otherwise (left to the next commit, abort or recover). The epoch stays
as it is in every failed case, which is what makes the next step's retry safe.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

from onceflow.committables import Committable
from onceflow.errors import one_line
from onceflow.ledger import Epoch, SinkCallFailed, SinkCallFailedKnown, SinkCallRetryLater
from onceflow.logs import Log
from onceflow.sinks.base import SinkCommitter
from onceflow.sinks.errors import KnownFailure, RetryLater

CommitterAction = Literal["commit", "abort"]
# A committer that says "retry later" is called again after each of these pauses before the step gives
# up for now.
RETRY_LATER_PAUSES_S: tuple[float, ...] = (0.5, 1.0, 2.0)


def call_committer(
    committer: SinkCommitter,
    epoch: Epoch,
    sink: str,
    action: CommitterAction,
    committables: Sequence[Committable],
    log: Log,
) -> None:
    """``committer.commit`` or ``.abort`` of one sink's committables of ``epoch``, by its outcome."""
    call = committer.commit if action == "commit" else committer.abort
    what = f"{epoch}: {action} of {len(committables)} committable(s) of sink {sink!r} failed"
    for pause in (*RETRY_LATER_PAUSES_S, None):
        try:
            call(committables)
            return
        except RetryLater as exc:
            if pause is None:
                raise SinkCallRetryLater(_left_for_later(what, epoch, action, exc)) from exc
            log(f"{epoch}: sink {sink!r} asks to retry the {action} later ({one_line(exc)})")
            time.sleep(pause)
        except KnownFailure as exc:
            raise SinkCallFailedKnown(
                f"{what} ({type(exc).__name__}: {one_line(exc)}); retrying cannot help: the epoch stays "
                f"{epoch.status} until the cause is mended"
            ) from exc
        except Exception as exc:
            raise SinkCallFailed(_left_for_later(what, epoch, action, exc)) from exc


def _left_for_later(what: str, epoch: Epoch, action: str, exc: Exception) -> str:
    return (
        f"{what} ({type(exc).__name__}: {one_line(exc)}); the epoch stays {epoch.status} and the "
        f"{action} is retried by the next commit, abort or recover"
    )
