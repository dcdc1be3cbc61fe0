"""The Delta sink across the coordinator's crash between a sink's commit and the ledger's record of it.

The coordinator commits an epoch's sinks in name order, so in the records pipeline the Delta sink commits
first: the first hit of ``participant_committed`` kills the coordinator with the epoch in the Delta log
(one commit, its ``txn`` at the epoch) and the ledger still holding the sink's participants PRECOMMITTED.
Recovery commits them again; the ``txn`` says the epoch is in, so the table gets no second version of it,
and every invariant stands after the catch-up. (The seeded random faults hit this point at other skips,
after other sinks: this is the one where the repeated commit is the Delta sink's.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.ledger import EpochStatus, Ledger, ParticipantStatus
from onceflow.sinks.delta.committer import committed_epoch
from tests.faults import harness, invariants

pytestmark = [pytest.mark.integration, pytest.mark.faults]

GOOD = 40


def test_a_delta_commit_repeated_by_recovery_adds_no_version(
    settings: Settings, pg: Any, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    scenario = harness.Scenario(harness.RECORDS, tmp_path, settings)
    spec, path = scenario.spec, invariants._delta_path(scenario.spec, "delta")
    scenario.create_topics()
    try:
        scenario.workload.produce(settings.kafka_bootstrap, GOOD, aborted=2, bad=("wrong_type",))
        crashed = scenario.epoch("local", harness.Crash("participant_committed"))
        assert crashed.crashed, crashed.stderr
        with Ledger.connect(scenario.env["ONCEFLOW_LEDGER_URL"]) as ledger:
            epoch = ledger.open_epoch(spec.name)
        assert epoch is not None and epoch.status is EpochStatus.COMMITTING
        # The Delta commit landed (every good record, once); the ledger knows of no committed participant.
        assert committed_epoch(DeltaTable(path), spec.name, "delta") == epoch.number
        assert sorted(invariants.delta_ids(spec, "delta")) == sorted(scenario.workload.good)
        statuses = scenario.sink_statuses(epoch.number)
        assert set(statuses) == set(harness.RECORDS_SINKS)
        assert all(s == {ParticipantStatus.PRECOMMITTED} for s in statuses.values()), statuses
        version = DeltaTable(path).version()

        scenario.must(scenario.run("recover"))
        assert DeltaTable(path).version() == version  # the repeated commit found its txn: no new version
        assert scenario.sink_statuses(epoch.number)["delta"] == {ParticipantStatus.COMMITTED}
        assert scenario.leftovers(pg) == []

        scenario.workload.produce(settings.kafka_bootstrap, GOOD // 2)
        scenario.catch_up("local")
        verdict = scenario.verdict(pg)
    finally:
        scenario.drop(pg)
    assert verdict.violations == []
    assert [(t.sink, t.delivered, t.duplicates) for t in verdict.tallies] == [
        (sink, len(scenario.workload.good), 0) for sink in harness.RECORDS_SINKS
    ]
    assert committed_epoch(DeltaTable(path), spec.name, "delta") == epoch.number + 1
