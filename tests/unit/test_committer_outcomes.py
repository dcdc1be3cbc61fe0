"""A committer's outcomes, as Flink's CommitRequest has them: done, retry later, failed for a known
reason, failed; and what the coordinator does with each."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from onceflow.committables import Committable
from onceflow.ledger import EpochStatus, Ledger, SinkCallFailed, SinkCallFailedKnown, SinkCallRetryLater
from onceflow.offsets import OffsetRange
from onceflow.protocol import committer_calls
from onceflow.protocol.coordinator import Coordinator
from onceflow.sinks.errors import RetryLater, StagedOutputLost
from onceflow.testing import RecordingCommitter, coordinator_for_tests

P = "clicks"


class Flaky(RecordingCommitter):
    """A recording committer whose next commits raise ``errors`` in turn, then work."""

    def __init__(self, *errors: Exception) -> None:
        super().__init__()
        self.errors = list(errors)
        self.attempts = 0

    def commit(self, committables: Sequence[Committable]) -> None:
        self.attempts += 1
        if self.errors:
            raise self.errors.pop(0)
        super().commit(committables)


def decided(tmp_path: Path, committer: RecordingCommitter) -> tuple[Ledger, Coordinator]:
    """An epoch of one participant, pre-committed and staged in ``committer``."""
    ledger = Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}", check=False)
    ledger.upgrade()
    epoch = ledger.plan_epoch(P, [OffsetRange("in", 0, 0, 3)], [("db", "s0-t0")])
    staged = Committable(P, 1, 0, "s0-t0", "a", "db", record_count=3, checksum="c")
    committer.stage(staged)
    ledger.precommit_slice(P, 1, epoch.attempt_token, [staged])
    return ledger, coordinator_for_tests(ledger, P, {"db": committer})


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committer_calls, "RETRY_LATER_PAUSES_S", (0.0, 0.0))


def test_retry_later_is_called_again_and_commits(tmp_path: Path) -> None:
    committer = Flaky(RetryLater("restarting"), RetryLater("restarting"))
    _, coordinator = decided(tmp_path, committer)
    assert coordinator.commit(number=1).status is EpochStatus.COMMITTED  # type: ignore[union-attr]
    assert committer.attempts == 3 and len(committer.visible) == 1


def test_retry_later_past_the_pauses_leaves_the_epoch_decided_for_the_next_step(tmp_path: Path) -> None:
    committer = Flaky(*(RetryLater("still restarting") for _ in range(3)))
    ledger, coordinator = decided(tmp_path, committer)
    with pytest.raises(SinkCallRetryLater, match="retried by the next commit, abort or recover"):
        coordinator.commit(number=1)
    assert committer.attempts == 3
    assert ledger.epoch(P, 1).status is EpochStatus.COMMITTING
    assert coordinator.recover().outcome == "committed"  # the next step finishes it


def test_a_known_failure_is_not_retried_and_says_so(tmp_path: Path) -> None:
    committer = Flaky(StagedOutputLost("the prepared transaction is gone and no marker says committed"))
    ledger, coordinator = decided(tmp_path, committer)
    with pytest.raises(SinkCallFailedKnown, match="retrying cannot help: the epoch stays COMMITTING"):
        coordinator.commit(number=1)
    assert committer.attempts == 1
    assert ledger.epoch(P, 1).status is EpochStatus.COMMITTING


def test_any_other_failure_is_left_to_the_next_step(tmp_path: Path) -> None:
    committer = Flaky(ConnectionError("refused"))
    _, coordinator = decided(tmp_path, committer)
    with pytest.raises(SinkCallFailed) as failed:
        coordinator.commit(number=1)
    assert not isinstance(failed.value, SinkCallFailedKnown | SinkCallRetryLater)
    assert committer.attempts == 1
    assert coordinator.commit(number=1).status is EpochStatus.COMMITTED  # type: ignore[union-attr]
