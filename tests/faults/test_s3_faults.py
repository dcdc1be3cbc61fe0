"""The files sink in a bucket across the faults only object storage has: the coordinator killed with the
epoch's log entry written and the ledger not told, and the S3 server itself killed (SIGKILL) while tasks
write and between the decision and the commit.

The records pipeline's ``files_s3`` sink writes its data objects in place, one marker per attempt under
``_staging/``, and commits an epoch by putting its log entry create-only: the entry is the commit point.
So a repeated commit must find the entry there and add none; an epoch whose writes met a dead server must
abort (or, once decided, be committed by recovery once the server is back); and in every case the
catch-up ends with every id once, one entry per epoch, no marker and no data object the log does not
name (`invariants.BucketTable`, which reads the bucket on its own).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.faults import POINTS
from onceflow.ledger import EpochStatus, Ledger, ParticipantStatus
from tests.faults import harness, invariants

pytestmark = [pytest.mark.integration, pytest.mark.faults]

GOOD = 40
SINK = "files_s3"
# The point right after the files sink put an epoch's log entry in the bucket, before it deletes the
# markers (only a bucket's commit passes it).
LOGGED = "files.logged"


def logged_crash() -> harness.Crash:
    assert LOGGED in POINTS
    return harness.Crash(LOGGED)


class Gateway:
    """The stack's S3 server, killed and started by its own script (`infra/s3.sh`, the stack's settings
    from the environment); started again at the end of a test that left it down."""

    SCRIPT = harness.REPO / "infra" / "s3.sh"

    def __init__(self) -> None:
        self.down = False

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        # stdout carries the client settings, credentials included: never kept.
        return subprocess.run(
            [str(self.SCRIPT), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )

    def kill(self) -> None:
        done = self._run("stop", "--kill")
        assert done.returncode == 0, done.stderr
        self.down = True
        assert self._run("status").returncode != 0, "the S3 server still answers after SIGKILL"

    def start(self) -> None:
        done = self._run("start")
        assert done.returncode == 0, done.stderr
        self.down = False


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    server = Gateway()
    try:
        yield server
    finally:
        if server.down:
            server.start()


@pytest.fixture
def scenario(settings: Settings, pg: Any, tmp_path: Path) -> Iterator[harness.Scenario]:
    """The records pipeline (two slices), 40 good records, an aborted transaction and a bad record in."""
    made = harness.Scenario(harness.RECORDS, tmp_path, settings)
    made.create_topics()
    made.workload.produce(settings.kafka_bootstrap, GOOD, aborted=2, bad=("wrong_type",))
    try:
        yield made
    finally:
        made.drop(pg)


def _epochs(scenario: harness.Scenario) -> list[int]:
    with Ledger.connect(scenario.env["ONCEFLOW_LEDGER_URL"]) as ledger:
        return [e.number for e in ledger.epochs(scenario.spec.name)]


def _open_epoch(scenario: harness.Scenario) -> Any:
    with Ledger.connect(scenario.env["ONCEFLOW_LEDGER_URL"]) as ledger:
        return ledger.open_epoch(scenario.spec.name)


def _entries_of(bucket: invariants.BucketTable, number: int) -> list[dict[str, Any]]:
    return [entry for _, entry in bucket.entries() if int(entry["epoch"]) == number]


def _log_objects(bucket: invariants.BucketTable) -> list[tuple[str, Any]]:
    """The log's objects with their last-modified times."""
    from pyarrow import fs as pafs

    infos = bucket.fs.get_file_info(pafs.FileSelector(f"{bucket.folder}/_onceflow_log", allow_not_found=True))
    return sorted((i.path, i.mtime) for i in infos)


def _caught_up_and_clean(scenario: harness.Scenario, pg: Any, bucket: invariants.BucketTable) -> None:
    """More records, catch-up, then every invariant; each committed epoch in exactly one log entry."""
    scenario.workload.produce(scenario.settings.kafka_bootstrap, GOOD // 2)
    scenario.catch_up("local")
    verdict = scenario.verdict(pg)
    assert verdict.violations == []
    assert [(t.sink, t.delivered, t.duplicates) for t in verdict.tallies] == [
        (sink, len(scenario.workload.good), 0) for sink in harness.RECORDS_SINKS
    ]
    with Ledger.connect(scenario.env["ONCEFLOW_LEDGER_URL"]) as ledger:
        committed = {e.number for e in ledger.epochs(scenario.spec.name) if e.status is EpochStatus.COMMITTED}
    logged = [int(entry["epoch"]) for _, entry in bucket.entries()]
    assert len(logged) == len(set(logged)) and set(logged) <= committed, (logged, committed)


def test_a_commit_repeated_by_recovery_adds_no_log_entry(scenario: harness.Scenario, pg: Any) -> None:
    bucket = invariants.BucketTable.of(scenario.spec, SINK)
    crashed = scenario.epoch("local", logged_crash())
    assert crashed.crashed, crashed.stderr
    epoch = _open_epoch(scenario)
    assert epoch is not None and epoch.status is EpochStatus.COMMITTING
    # The entry is in the bucket and names every good record once; the ledger knows of no commit of it.
    (entry,) = _entries_of(bucket, epoch.number)
    assert sorted(bucket.ids()) == sorted(scenario.workload.good)
    assert scenario.sink_statuses(epoch.number)[SINK] == {ParticipantStatus.PRECOMMITTED}
    # Killed between the commit point and the markers' delete: the markers are still there.
    assert bucket.objects(f"{bucket.root}/_staging/{scenario.spec.name}") != []
    logged, written = bucket.entries(), _log_objects(bucket)

    scenario.must(scenario.run("recover"))
    # The repeated commit found its entry: none added, none written again (same object, same time).
    assert bucket.entries() == logged and _log_objects(bucket) == written
    assert scenario.sink_statuses(epoch.number)[SINK] == {ParticipantStatus.COMMITTED}
    assert scenario.epoch_status(epoch.number) is EpochStatus.COMMITTED
    assert scenario.leftovers(pg) == []  # markers deleted, nothing unnamed
    assert entry["record_count"] == GOOD
    _caught_up_and_clean(scenario, pg, bucket)


def test_the_s3_server_killed_while_tasks_write(
    scenario: harness.Scenario, pg: Any, gateway: Gateway
) -> None:
    bucket = invariants.BucketTable.of(scenario.spec, SINK)
    # The first slice's tasks have written their data objects and markers; the slice has not registered
    # them. The S3 server dies, then the second slice's tasks write.
    running = scenario.start("epoch", "--executor", "local", pause="slice_after_tasks")
    running.wait()
    written = bucket.objects(bucket.root)
    assert any("/_staging/" in p for p in written) and any(p.endswith(".parquet") for p in written), written
    gateway.kill()
    outcome = running.resume()
    assert outcome.returncode in (1, 2), outcome.output  # failed: aborted, or left to recovery
    gateway.start()
    epoch = max(_epochs(scenario))
    assert scenario.epoch_status(epoch) in (EpochStatus.PLANNED, EpochStatus.ABORTING, EpochStatus.ABORTED)
    assert _entries_of(bucket, epoch) == []
    assert set(written) <= set(bucket.objects(bucket.root))  # nothing could delete them while it was down

    scenario.must(scenario.run("recover"))
    assert scenario.epoch_status(epoch) is EpochStatus.ABORTED
    assert scenario.leftovers(pg) == []  # the attempts' markers and data objects are gone
    _caught_up_and_clean(scenario, pg, bucket)


def test_the_s3_server_killed_between_the_decision_and_the_commit(
    scenario: harness.Scenario, pg: Any, gateway: Gateway
) -> None:
    bucket = invariants.BucketTable.of(scenario.spec, SINK)
    running = scenario.start("epoch", "--executor", "local", pause="after_decision")
    running.wait()  # every participant pre-committed, the decision durable, no sink committed
    gateway.kill()
    outcome = running.resume()
    assert outcome.returncode == 2, outcome.output  # the commit failed; the decision stands
    epoch = _open_epoch(scenario)
    assert epoch is not None and epoch.status is EpochStatus.COMMITTING
    # The sinks before it in the commit order (delta, files) committed; it and the ones after did not.
    assert scenario.sink_statuses(epoch.number) == {
        sink: {ParticipantStatus.COMMITTED if sink < SINK else ParticipantStatus.PRECOMMITTED}
        for sink in harness.RECORDS_SINKS
    }
    gateway.start()
    assert _entries_of(bucket, epoch.number) == []  # the server died before the commit point

    scenario.must(scenario.run("recover"))
    assert scenario.epoch_status(epoch.number) is EpochStatus.COMMITTED
    (entry,) = _entries_of(bucket, epoch.number)
    assert entry["record_count"] == GOOD
    assert sorted(bucket.ids()) == sorted(scenario.workload.good)
    assert scenario.leftovers(pg) == []
    _caught_up_and_clean(scenario, pg, bucket)
