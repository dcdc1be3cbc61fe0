"""Faults of a replicated Kafka cluster: three KRaft brokers, topics and the transaction state log with
three replicas and min.insync.replicas=2, producers with acks=all.

The module starts a cluster of its own (`infra/kafka.sh` with ONCEFLOW_KAFKA_BROKERS=3, its data under
the test's temporary folder, its ports 100 above the stack's broker) and points every scenario at it;
PostgreSQL is the stack's. Each fault lands at the named point where it hurts most, chosen by asking
the cluster who leads what at that moment: the leader of the input partition under a read, the leader
of an output partition holding a publish, the transaction coordinator (killed, or paused past its
session timeout and woken as a zombie) between the publish and the commit, every broker in turn while
epochs run, the active controller. After each: recovery; the Kafka sink's output checked for
all-or-nothing transactions (what a read_committed reader sees of each input partition is exactly the
records below the offsets committed in the same transactions); catch-up while the broker comes back;
then, on the healed cluster, more records and catch-up again; then every invariant of the harness
(nothing lost or duplicated in any sink, no aborted record read, nothing left prepared or staged).
Last, named crash points of the Kafka sink and of the protocol run against the cluster as they do
against the single broker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.sinks.kafka import KafkaCommitter, transactional_id
from tests.faults import harness, invariants
from tests.faults.kafka_cluster import TRANSACTION_STATE, KafkaCluster, java_partition, resolve

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]

PORT_OFFSET = 100  # the cluster's ports, above the stack's broker and controller ports
GOOD = 40  # records produced before each fault (and 20 more once the cluster has healed)
# A broker that stops heartbeating is fenced (its leaderships and coordinators move) after 4 s, not
# Kafka's default 9 s: the same failover, sooner, so that the module fits its time budget.
BROKER_CONF = "broker.session.timeout.ms=4000 broker.heartbeat.interval.ms=1000"


# ------------------------------------------------------------------------------------------ fixtures


class ClusterScenario(harness.Scenario):
    """A scenario that remembers the steps it started in the background, to end them if a test fails."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started: list[harness.Paused] = []

    def start(self, step: str, *extra: str, pause: str) -> harness.Paused:
        paused = super().start(step, *extra, pause=pause)
        self.started.append(paused)
        return paused


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A three-broker cluster for this module; the test process's clients default to it meanwhile."""
    stack = resolve(os.environ)
    made = KafkaCluster.private(
        tmp_path_factory.mktemp("kafka-cluster"),
        int(stack["ONCEFLOW_KAFKA_PORT"]) + PORT_OFFSET,
        int(stack["ONCEFLOW_KAFKA_CONTROLLER_PORT"]) + PORT_OFFSET,
        conf=BROKER_CONF,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP", made.bootstrap)  # sinks read without "bootstrap" use it
        try:
            made.up()
            yield made
        finally:
            made.down()


@pytest.fixture(scope="module")
def cluster_settings(settings: Settings, cluster: KafkaCluster) -> Settings:
    return dataclasses.replace(settings, kafka_bootstrap=cluster.bootstrap)


@pytest.fixture
def make_scenario(
    cluster: KafkaCluster, cluster_settings: Settings, tmp_path: Path, pg: Any
) -> Iterator[Callable[..., ClusterScenario]]:
    """Scenarios of the records pipeline on the cluster (healthy when each begins), dropped afterwards."""
    made: list[ClusterScenario] = []

    def make(partitions: int = 3, **env: str) -> ClusterScenario:
        cluster.wait_healthy(120)
        scenario = ClusterScenario(
            harness.RECORDS,
            tmp_path,
            cluster_settings,
            partitions=partitions,
            env={"ONCEFLOW_KAFKA_BOOTSTRAP": cluster.bootstrap, **env},
        )
        made.append(scenario)
        scenario.create_topics()
        return scenario

    yield make
    for scenario in made:
        for paused in scenario.started:  # a test that failed while an epoch was paused
            if paused.process.poll() is None:
                paused.process.kill()
                paused.process.communicate()
        gids = f"onceflow:{scenario.spec.name}:%"
        if pg.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", [gids]).fetchone()[0]:
            with contextlib.suppress(Exception):  # roll back what a failed test left prepared
                scenario.run("recover")
        pg.execute("SET lock_timeout = '20s'")  # rather a failed drop than a hung suite
        scenario.drop(pg)


@pytest.fixture
def scenario(make_scenario: Callable[..., ClusterScenario]) -> ClusterScenario:
    made = make_scenario()
    made.workload.produce(made.settings.kafka_bootstrap, GOOD, aborted=3, bad=("malformed_json",))
    return made


# ------------------------------------------------------------------------------------------- helpers


def out_topic(scenario: harness.Scenario) -> str:
    return scenario.env["ONCEFLOW_FAULTS_OUT_TOPIC"]


def in_topic(scenario: harness.Scenario) -> str:
    return scenario.env["ONCEFLOW_FAULTS_TOPIC"]


def first_transaction(scenario: harness.Scenario) -> str:
    """The transactional id of the Kafka sink's first publish of an epoch (slice 0 commits first)."""
    return transactional_id(scenario.spec.name, "kafka", 0)


def assert_all_or_nothing(scenario: harness.Scenario) -> None:
    """The Kafka sink's transactions are atomic: a read_committed reader of the output sees, of each
    input partition, exactly the good records below the offset the sink's consumer group holds, and
    each once (records and offsets are committed in one transaction, so any other view is a
    transaction seen in part, twice, or after its abort)."""
    sink = next(s for s in scenario.spec.sinks if s.name == "kafka")
    committer = KafkaCommitter({**sink.config, "bootstrap": scenario.settings.kafka_bootstrap})
    topic = in_topic(scenario)
    group = committer.committed_offsets(scenario.spec.name, [(topic, p) for p in range(scenario.partitions)])
    expected = sorted(
        record_id
        for record_id, (partition, offset) in scenario.workload.good.items()
        if offset < group[(topic, partition)]
    )
    seen = invariants.kafka_records(scenario.settings.kafka_bootstrap, out_topic(scenario))
    assert sorted(int(value["id"]) for _, value in seen) == expected


def assert_delivered(scenario: harness.Scenario, pg: Any) -> None:
    verdict = scenario.verdict(pg)
    assert verdict.violations == []
    assert [(t.sink, t.delivered, t.lost, t.duplicates, t.unexpected) for t in verdict.tallies] == [
        (sink, len(scenario.workload.good), 0, 0, 0) for sink in harness.RECORDS_SINKS
    ]


def settle(scenario: harness.Scenario, pg: Any, cluster: KafkaCluster, down: int | None) -> None:
    """After a fault: recover (nothing left behind, transactions atomic), catch up while broker ``down``
    starts again, then on the healed cluster produce more and catch up by the pipeline's own epochs,
    and check every invariant."""
    scenario.must(scenario.run("recover"))
    assert scenario.leftovers(pg) == []
    assert_all_or_nothing(scenario)
    with ThreadPoolExecutor(1) as pool:
        healing: Future[None] | None = None if down is None else pool.submit(cluster.start, down)
        scenario.catch_up("local")
        if healing is not None:
            healing.result(timeout=300)
    cluster.wait_healthy(120)
    scenario.workload.produce(scenario.settings.kafka_bootstrap, GOOD // 2, aborted=2)
    scenario.catch_up("local")
    assert_all_or_nothing(scenario)
    assert_delivered(scenario, pg)


def kill_while_paused(
    scenario: harness.Scenario, cluster: KafkaCluster, pause: str, victim_of: Callable[[], int]
) -> tuple[int, harness.StepOutcome]:
    """Run an epoch to ``pause``, SIGKILL the broker ``victim_of`` names then, and let the epoch go on
    against the cluster without it; returns the victim and the epoch's outcome."""
    running = scenario.start("epoch", "--executor", "local", pause=pause)
    running.wait()
    victim = victim_of()
    cluster.kill(victim)
    outcome = running.resume()
    # Committed, or failed and aborted (exit 1) or left to recovery (exit 2): never a hang or a crash.
    assert outcome.returncode in (0, 1, 2), outcome.stderr
    return victim, outcome


# --------------------------------------------------------------------------------------------- tests


def test_topics_and_the_transaction_log_have_three_replicas_and_two_in_sync(scenario, cluster) -> None:
    for topic in (in_topic(scenario), out_topic(scenario), TRANSACTION_STATE):
        for number, state in cluster._partitions(topic).items():
            assert len(state.replicas) == 3 and sorted(state.isr) == sorted(state.replicas), (topic, number)
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource("topic", out_topic(scenario))
    configs = cluster.admin().describe_configs([resource])[resource].result(30)
    assert configs["min.insync.replicas"].value == "2"


def test_leader_of_an_input_partition_killed_mid_read(make_scenario, cluster, pg) -> None:
    # One input partition, so the task paused mid-read is reading from the partition whose leader dies;
    # the slice's next tasks and the other slice read it from the new leader.
    scenario = make_scenario(partitions=1)
    scenario.workload.produce(scenario.settings.kafka_bootstrap, GOOD, aborted=3)
    topic = in_topic(scenario)
    victim, _ = kill_while_paused(scenario, cluster, "task_mid_read", lambda: cluster.leader(topic, 0))
    assert cluster.wait_leader(topic, 0, other_than=victim) != victim
    settle(scenario, pg, cluster, victim)


def test_leader_of_the_output_partition_killed_during_the_kafka_sinks_publish(scenario, cluster, pg) -> None:
    topic = out_topic(scenario)

    def output_leader() -> int:
        # An output partition led by another broker than the transaction coordinator, if there is one,
        # so that this fault is the partition leader's alone.
        coordinator = cluster.transaction_coordinator(first_transaction(scenario))
        leaders = [cluster.leader(topic, p) for p in (0, 1)]
        return next((leader for leader in leaders if leader != coordinator), leaders[0])

    victim, _ = kill_while_paused(scenario, cluster, "kafka.produced", output_leader)
    settle(scenario, pg, cluster, victim)


def test_transaction_coordinator_killed_before_send_offsets_to_transaction(scenario, cluster, pg) -> None:
    # Paused after the publish: the next call, send_offsets_to_transaction, meets a coordinator failover.
    victim, _ = kill_while_paused(
        scenario,
        cluster,
        "kafka.produced",
        lambda: cluster.transaction_coordinator(first_transaction(scenario)),
    )
    settle(scenario, pg, cluster, victim)


def test_transaction_coordinator_killed_between_send_offsets_and_commit_transaction(
    scenario, cluster, pg
) -> None:
    def open_transactions_coordinator() -> int:
        # Kafka's own tools confirm the target: the transaction is open, holds the output and the
        # offsets, and the broker about to die coordinates it.
        txn = first_transaction(scenario)
        described = cluster.describe_transaction(txn)
        assert described["TransactionState"] == "Ongoing", described
        assert out_topic(scenario) in described["TopicPartitions"], described
        assert "__consumer_offsets" in described["TopicPartitions"], described
        coordinator = cluster.transaction_coordinator(txn)
        assert int(described["CoordinatorId"]) == coordinator, described
        return coordinator

    victim, _ = kill_while_paused(scenario, cluster, "kafka.offsets_sent", open_transactions_coordinator)
    settle(scenario, pg, cluster, victim)


def test_transaction_coordinator_paused_past_its_session_and_woken_as_a_zombie(scenario, cluster, pg) -> None:
    running = scenario.start("epoch", "--executor", "local", pause="kafka.offsets_sent")
    running.wait()
    txn = first_transaction(scenario)
    zombie = cluster.transaction_coordinator(txn)
    states = java_partition(txn, len(cluster._partitions(TRANSACTION_STATE)))
    cluster.pause(zombie)
    try:
        # The controller fences the silent broker and another one takes over its transaction log.
        successor = cluster.wait_leader(TRANSACTION_STATE, states, other_than=zombie, timeout=60)
    finally:
        cluster.resume(zombie)  # it wakes up believing it still coordinates the open transaction
    assert successor != zombie
    outcome = running.resume()
    assert outcome.returncode in (0, 1, 2), outcome.stderr
    settle(scenario, pg, cluster, None)


def test_rolling_restart_of_every_broker_while_epochs_run(make_scenario, cluster, pg) -> None:
    # A backlog that small epochs take through the whole restart: 4 records per partition each.
    scenario = make_scenario(ONCEFLOW_FAULTS_MAX_RECORDS="4")
    scenario.workload.produce(scenario.settings.kafka_bootstrap, 120, aborted=3, bad=("wrong_type",))
    restarted: list[int] = []
    with ThreadPoolExecutor(1) as pool:
        epochs = pool.submit(run_epochs_until, scenario, restarted, len(cluster.nodes))
        for node in cluster.nodes:
            cluster.stop(node)  # SIGTERM: controlled shutdown, leadership handed over first
            cluster.start(node)
            cluster.wait_healthy(120)  # every ISR full again before the next broker goes
            restarted.append(node)
        outcomes = epochs.result(timeout=300)
    assert restarted == list(cluster.nodes)
    committed = [o for o in outcomes if o.returncode == 0 and o.output.get("span", 0) > 0]
    assert len(outcomes) >= 3 and committed, [(o.returncode, o.output) for o in outcomes]
    del scenario.env["ONCEFLOW_FAULTS_MAX_RECORDS"]  # the rest of the backlog in one epoch
    settle(scenario, pg, cluster, None)


def run_epochs_until(
    scenario: harness.Scenario, restarted: list[int], brokers: int
) -> list[harness.StepOutcome]:
    """Epochs back to back (recovering after any that fails) until every broker has restarted."""
    outcomes = []
    deadline = time.monotonic() + 240
    while len(restarted) < brokers and time.monotonic() < deadline:
        outcome = scenario.epoch("local")
        outcomes.append(outcome)
        if outcome.returncode != 0:
            scenario.must(scenario.run("recover"))
    return outcomes


def test_controller_quorum_loses_its_leader_mid_epoch(scenario, cluster, pg) -> None:
    running = scenario.start("epoch", "--executor", "local", pause="task_after_stage")
    running.wait()
    controller = cluster.wait_controller(30)
    cluster.kill(controller)  # a combined node: its partitions fail over under the next controller
    assert cluster.wait_controller(60, other_than=controller) != controller
    outcome = running.resume()
    assert outcome.returncode in (0, 1, 2), outcome.stderr
    settle(scenario, pg, cluster, controller)


# The Kafka sink's crash points and one of the protocol's (decided, nothing committed: recovery
# publishes), as the single-broker matrix runs them.
CLUSTER_POINTS = ("kafka.produced", "kafka.offsets_sent", "kafka.committed", "after_decision")


def test_named_crash_points_on_the_cluster(make_scenario, cluster, pg) -> None:
    scenario = make_scenario()
    faults = [(harness.named_fault(name, harness.EPOCH_POINTS[name]), 30, 2, ()) for name in CLUSTER_POINTS]
    run = harness.run_faults(scenario, pg, faults, executor="local")
    assert run.not_fired == []
    assert run.violations == []
    assert_all_or_nothing(scenario)
    assert cluster.under_replicated() == []
