"""Lease renewal is what keeps a runner's epoch when recovery cannot see the runner: an epoch whose owner
runs on another host (as the ledger records it) is kept by `recover` while the owner's heartbeat renews
its lease, with the task output it staged, and taken over (aborted, its staging rolled back) once the
heartbeat stops and the lease runs out. A real SQLite ledger and files sink; a lease of 2 s."""

from __future__ import annotations

import time
from pathlib import Path

from onceflow.config import Settings
from onceflow.executor.slices import SliceRef
from onceflow.executor.writing import write_task
from onceflow.ledger import EpochStatus, Ledger
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.protocol.coordinator import Coordinator
from onceflow.protocol.owners import process_alive

LEASE_S = 2.0  # the heartbeat beats every 0.67 s (a third of the lease, at least 0.5 s)
RANGE = OffsetRange("in", 0, 0, 4)
# A runner on another machine: its pid means nothing here, so only its lease can say it is alive.
REMOTE_OWNER = "scheduled__2026-11-28 (pid 4242 on runner-elsewhere.example)"


def test_a_remote_owners_epoch_is_kept_while_its_heartbeat_runs_and_taken_over_after(tmp_path: Path) -> None:
    sink = SinkSpec("out", "files", {"root": str(tmp_path / "files"), "table": "t"})
    spec = Pipeline("leased", KafkaSource(("in",)), JsonFormat({"n": "int"}), (sink,))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    settings = Settings(tmp_path, "127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", url, lease_s=LEASE_S)
    assert process_alive(REMOTE_OWNER) is None
    # The remote runner's side: its own ledger connection, its plan, a task's staged output, its heartbeat.
    with Ledger.connect(url, check=False) as runner_ledger, Ledger.connect(url, check=False) as ledger:
        runner_ledger.upgrade()
        epoch = runner_ledger.plan_epoch(
            spec.name, [RANGE], [("out", "s0-t0")], owner=REMOTE_OWNER, lease_s=LEASE_S
        )
        ref = SliceRef(spec, epoch.number, 0, (RANGE,), "127.0.0.1:1", settings=settings)
        write_task(ref, sink, "s0-t0", "a1", iter([{"n": 1}, {"n": 2}]))
        runner = Coordinator.for_pipeline(spec, runner_ledger, settings)
        operator = Coordinator.for_pipeline(spec, ledger, settings)
        with runner.renewing_lease(epoch.number):
            for _ in range(2):  # well past the lease that the plan gave: only renewals keep it
                time.sleep(LEASE_S)
                report = operator.recover(by="an operator")
                assert (report.outcome, report.orphans_aborted) == ("kept", ()), report
                assert REMOTE_OWNER in report.reason
        assert staged(tmp_path) == ["attempt-a1"]
        renewed = ledger.epoch(spec.name, epoch.number)
        assert renewed.status is EpochStatus.PLANNED
        assert renewed.lease_expires_at is not None and epoch.lease_expires_at is not None
        assert (renewed.lease_expires_at - epoch.lease_expires_at).total_seconds() >= LEASE_S

        # The heartbeat stopped (the runner died, or its host is cut off): once the lease runs out, the
        # next recovery takes the epoch over.
        time.sleep(LEASE_S + 0.3)  # a renewal gives LEASE_S from its own time
        report = operator.recover(by="an operator")
        assert report.outcome == "aborted", report
        assert "expired" in report.reason and REMOTE_OWNER in report.reason
        assert ledger.epoch(spec.name, epoch.number).status is EpochStatus.ABORTED
        assert staged(tmp_path) == []
        # Its range is read again by the next epoch.
        assert ledger.plan_epoch(spec.name, [RANGE], [("out", "s0-t0")]).number == epoch.number + 1


def staged(tmp_path: Path) -> list[str]:
    return sorted(p.parent.name for p in (tmp_path / "files/_staging").glob("**/part-*.parquet"))
