"""Faults around the edges of the protocol: services restarting mid-epoch, a zombie task attempt, and an
operator's commit and abort racing each other. Each ends with recovery, catch-up and every invariant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.ledger import Ledger
from tests.faults import harness, invariants

pytestmark = [pytest.mark.integration, pytest.mark.faults]

INFRA = harness.REPO / "infra"


def restart(service: str) -> None:
    """Kill a local service with SIGKILL and start it again, as the operator's scripts do."""
    for action in (["stop", "--kill"], ["start"]):
        done = subprocess.run([str(INFRA / f"{service}.sh"), *action], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def finish(scenario: harness.Scenario, pg) -> None:  # type: ignore[no-untyped-def]
    scenario.must(scenario.run("recover"))
    scenario.catch_up("local")
    verdict = scenario.verdict(pg)
    assert verdict.violations == []
    assert all(t.delivered == len(scenario.workload.good) for t in verdict.tallies)


@pytest.fixture
def scenario(settings, tmp_path):  # type: ignore[no-untyped-def]
    import psycopg

    made = harness.Scenario(harness.RECORDS, tmp_path, settings)
    made.create_topics()
    made.workload.produce(settings.kafka_bootstrap, 60, aborted=3, bad=("malformed_json",))
    yield made
    with psycopg.connect(settings.pg_dsn, autocommit=True) as fresh:  # PostgreSQL may have restarted
        made.drop(fresh)


def test_kafka_broker_killed_and_restarted_mid_epoch(scenario, pg) -> None:
    running = scenario.start("epoch", "--executor", "local", pause="task_after_stage")
    running.wait()
    restart("kafka")  # the next tasks read, and the coordinator publishes, through a new broker process
    running.resume()
    finish(scenario, pg)


def test_postgres_killed_and_restarted_between_two_sinks_commits(scenario, pg, settings) -> None:
    running = scenario.start("epoch", "--executor", "local", pause="participant_committed")
    running.wait()  # the decision is durable and the first sink committed; PostgreSQL's prepared rows wait
    restart("postgres")
    outcome = running.resume()
    assert outcome.returncode in (0, 2), outcome.stderr  # committed, or failed and left to recovery
    import psycopg

    with psycopg.connect(settings.pg_dsn, autocommit=True) as fresh:
        finish(scenario, fresh)


def test_a_zombie_attempt_finishing_after_its_epoch_was_aborted_rolls_itself_back(scenario, pg) -> None:
    zombie = scenario.start("epoch", "--executor", "local", pause="task_after_stage")
    zombie.wait()  # one task attempt staged its output and is about to report it
    aborted = scenario.must(scenario.run("abort"))
    assert aborted.output["status"] == "ABORTED"
    outcome = zombie.resume()
    assert outcome.returncode == 1 and "refused" in outcome.output["failed"]
    staged = [p for p in Path(scenario.root).glob("**/_staging/**/*") if p.is_file()]
    assert staged == []  # the zombie rolled its staging back itself, before any recovery ran
    assert invariants.BucketTable.of(scenario.spec, "files_s3").leftovers() == []  # its marker and object too
    finish(scenario, pg)


def test_commit_and_abort_cleared_at_the_same_time_have_exactly_one_winner(scenario, pg) -> None:
    cli = str(Path(sys.executable).parent / "onceflow")
    env = {**scenario.env, "ONCEFLOW_PIPELINES": harness.RECORDS}
    for round_ in range(3):
        if round_:
            scenario.workload.produce(scenario.settings.kafka_bootstrap, 20)
        undecided = scenario.epoch("local", harness.Crash("before_decision"))
        assert undecided.crashed
        with Ledger.connect(scenario.env["ONCEFLOW_LEDGER_URL"]) as ledger:
            epoch = ledger.open_epoch(scenario.spec.name)
        assert epoch is not None
        both = [
            subprocess.Popen(
                [cli, action, scenario.spec.name, str(epoch.number)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for action in ("commit", "abort")
        ]
        codes = [p.wait(timeout=120) for p in both]
        assert sorted(codes) == [0, 3], [p.stderr.read() for p in both if p.stderr]  # one wins, one refused
        finish(scenario, pg)
