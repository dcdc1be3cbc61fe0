"""The local Kafka cluster of `infra/kafka.sh` (``ONCEFLOW_KAFKA_BROKERS=3``) as the fault tests drive it.

A `KafkaCluster` is built from the environment infra/env.sh resolves (broker count, ports, data folder),
so it finds the pid, log and data folder of each broker exactly where the script put them. Its faults are
real: ``kill`` is a SIGKILL of the broker's JVM, ``pause`` a SIGSTOP, ``start`` runs the operator's own
``infra/kafka.sh start-broker N``. Who leads what is asked of the cluster itself: partition leaders
through the admin API, the transaction coordinator as the leader of the ``__transaction_state``
partition its transactional id hashes to (how the brokers place it), the KRaft controller from the
quorum state the voters write down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
KAFKA_SH = REPO / "infra" / "kafka.sh"
ENV_SH = REPO / "infra" / "env.sh"
TRANSACTION_STATE = "__transaction_state"
CONSUMER_OFFSETS = "__consumer_offsets"
# The settings infra/env.sh resolves that the cluster is made of.
_SETTINGS = (
    "ONCEFLOW_KAFKA_BROKERS",
    "ONCEFLOW_KAFKA_HOST",
    "ONCEFLOW_KAFKA_PORT",
    "ONCEFLOW_KAFKA_CONTROLLER_PORT",
    "ONCEFLOW_KAFKA_DATA",
    "ONCEFLOW_KAFKA_BOOTSTRAP",
)


@dataclass(frozen=True)
class PartitionState:
    """Who leads one partition, and which replicas are in sync with it."""

    leader: int  # -1 while it has none
    isr: tuple[int, ...]
    replicas: tuple[int, ...]


class ClusterError(AssertionError):
    """The cluster did not do what a fault test needs of it (start, heal, elect) in time."""


def java_partition(key: str, partitions: int) -> int:
    """The partition of an internal topic that ``key`` (a transactional or group id) belongs to:
    ``Utils.abs(key.hashCode()) % partitions``, with Java's String.hashCode over UTF-16 code units."""
    h = 0
    encoded = key.encode("utf-16-be")
    for i in range(0, len(encoded), 2):
        h = (31 * h + int.from_bytes(encoded[i : i + 2], "big")) & 0xFFFFFFFF
    signed = h - (1 << 32) if h & 0x80000000 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


def resolve(env: Mapping[str, str]) -> dict[str, str]:
    """The cluster's settings as infra/env.sh resolves them under ``env``."""
    script = f'. "{ENV_SH}" && ' + " && ".join(f'printf "%s\\n" "${name}"' for name in _SETTINGS)
    shown = subprocess.run(["bash", "-c", script], env=dict(env), capture_output=True, text=True, check=True)
    return dict(zip(_SETTINGS, shown.stdout.splitlines(), strict=True))


class KafkaCluster:
    """Brokers 1..N of the local KRaft cluster: their processes, and who leads what."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env: dict[str, str] = dict(os.environ if env is None else env)
        resolved = resolve(self.env)
        self.env.update(resolved)  # the script and the clients see one and the same cluster
        self.brokers = int(resolved["ONCEFLOW_KAFKA_BROKERS"])
        self.host = resolved["ONCEFLOW_KAFKA_HOST"]
        self.port = int(resolved["ONCEFLOW_KAFKA_PORT"])
        self.controller_port = int(resolved["ONCEFLOW_KAFKA_CONTROLLER_PORT"])
        self.data = Path(resolved["ONCEFLOW_KAFKA_DATA"])
        self.bootstrap = resolved["ONCEFLOW_KAFKA_BOOTSTRAP"]
        self._admins: dict[tuple[int, ...], Any] = {}
        self._paused: set[int] = set()

    @classmethod
    def private(
        cls,
        data: Path,
        port: int,
        controller_port: int,
        *,
        brokers: int = 3,
        heap: str = "384m",
        conf: str = "",
    ) -> KafkaCluster:
        """A cluster of its own (data folder, ports; ``conf``: more broker settings, as
        ONCEFLOW_KAFKA_CONF takes them) for a test module, next to the stack's broker."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_KAFKA_")}
        env.update(
            {
                "ONCEFLOW_KAFKA_BROKERS": str(brokers),
                "ONCEFLOW_KAFKA_PORT": str(port),
                "ONCEFLOW_KAFKA_CONTROLLER_PORT": str(controller_port),
                "ONCEFLOW_KAFKA_DATA": str(data),
                "ONCEFLOW_KAFKA_HEAP": heap,
                "ONCEFLOW_KAFKA_CONF": conf,
            }
        )
        if "ONCEFLOW_KAFKA_HOST" in os.environ:
            env["ONCEFLOW_KAFKA_HOST"] = os.environ["ONCEFLOW_KAFKA_HOST"]
        return cls(env)

    # ------------------------------------------------------------------------------------ processes

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(range(1, self.brokers + 1))

    def folder(self, node: int) -> Path:
        self._check(node)
        return self.data if self.brokers == 1 else self.data / f"broker-{node}"

    def broker_port(self, node: int) -> int:
        self._check(node)
        return self.port + 2 * (node - 1)

    def pid(self, node: int) -> int | None:
        """The broker's JVM, None when it is not running."""
        try:
            pid = int((self.folder(node) / "kafka.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    def kill(self, node: int) -> None:
        """SIGKILL the broker (a power cut: no controlled shutdown), and wait until it is gone."""
        pid = self.pid(node)
        if pid is None:
            raise ClusterError(f"broker {node} is not running, so it cannot be killed")
        self.resume(node)  # a stopped process dies on SIGKILL too, but say so explicitly
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: not _alive(pid), 30, f"broker {node} (pid {pid}) still alive after SIGKILL")

    def stop(self, node: int) -> None:
        """Stop the broker cleanly (SIGTERM: controlled shutdown), as an operator's rolling restart does."""
        self._script("stop-broker", str(node))

    def start(self, node: int) -> None:
        """Start the broker again through ``infra/kafka.sh start-broker N``; returns once it answers."""
        self._script("start-broker", str(node))

    def pause(self, node: int) -> None:
        """SIGSTOP the broker: alive, holding its sockets, silent (a long GC pause, a frozen VM)."""
        os.kill(self._running(node), signal.SIGSTOP)
        self._paused.add(node)

    def resume(self, node: int) -> None:
        pid = self.pid(node)
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        self._paused.discard(node)

    def up(self) -> None:
        """Start every broker (formatting storage on the first start); returns once all answer."""
        self._script("start")

    def down(self) -> None:
        """Stop every broker (SIGKILL: the data is thrown away with the test's folder anyway)."""
        for node in self.nodes:
            self.resume(node)
        self._script("stop", "--kill")

    # ------------------------------------------------------------------------------------- leaders

    def leader(self, topic: str, partition: int) -> int:
        """The node that leads ``topic``'s ``partition`` now (-1 while it has none)."""
        return self._partitions(topic)[partition].leader

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node that coordinates ``transactional_id``'s transactions (the leader of its partition of
        ``__transaction_state``, which exists once a transactional producer has been initialized)."""
        states = self._partitions(TRANSACTION_STATE)
        return states[java_partition(transactional_id, len(states))].leader

    def group_coordinator(self, group: str) -> int:
        """The node that coordinates consumer group ``group`` (and stores its committed offsets)."""
        offsets = self._partitions(CONSUMER_OFFSETS)
        return offsets[java_partition(group, len(offsets))].leader

    def describe_transaction(self, transactional_id: str) -> dict[str, str]:
        """Kafka's own account of a transactional id (``infra/kafka.sh transactions describe``):
        ``CoordinatorId``, ``TransactionState`` (``Ongoing``, ``CompleteCommit``, ...) and the others."""
        shown = self._script("transactions", "describe", "--transactional-id", transactional_id)
        rows = [[cell.strip() for cell in line.split("\t")] for line in shown.splitlines() if "\t" in line]
        if len(rows) < 2:
            raise ClusterError(f"no description of transactional id {transactional_id!r}: {shown!r}")
        return dict(zip(rows[0], rows[1], strict=False))

    def controller_leader(self) -> int | None:
        """The active KRaft controller: the leader that a majority of the running voters record for the
        latest epoch in their quorum state; None while there is none (an election is on)."""
        seen: list[tuple[int, int]] = []
        for node in self.nodes:
            if self.pid(node) is None:
                continue
            path = self.folder(node) / "log" / "__cluster_metadata-0" / "quorum-state"
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            seen.append((int(state.get("leaderEpoch", -1)), int(state.get("leaderId", -1))))
        if not seen:
            return None
        epoch = max(e for e, _ in seen)
        leaders = [leader for e, leader in seen if e == epoch]
        leader = leaders[0]
        if leader < 0 or leaders.count(leader) * 2 <= self.brokers or self.pid(leader) is None:
            return None
        return leader

    def wait_controller(self, timeout: float = 60, *, other_than: int | None = None) -> int:
        """Until the quorum has an active controller (other than ``other_than``); returns it."""
        found: list[int] = []

        def elected() -> bool:
            leader = self.controller_leader()
            if leader is None or leader == other_than:
                return False
            found.append(leader)
            return True

        _wait(elected, timeout, f"the KRaft quorum elected no controller within {timeout:g} s")
        return found[-1]

    def wait_leader(self, topic: str, partition: int, *, other_than: int, timeout: float = 60) -> int:
        """Until ``topic``'s ``partition`` has a leader other than ``other_than``; returns it."""
        found: list[int] = []

        def moved() -> bool:
            leader = self.leader(topic, partition)
            found.append(leader)
            return leader not in (-1, other_than)

        _wait(moved, timeout, f"{topic}[{partition}] still led by {found[-1:]} after {timeout:g} s")
        return found[-1]

    def under_replicated(self) -> list[str]:
        """Partitions whose ISR is not their whole replica set, or that have no leader (all topics)."""
        problems = []
        for name, topic in sorted(self.admin().list_topics(timeout=10).topics.items()):
            for number, p in sorted(topic.partitions.items()):
                if p.leader < 0 or sorted(p.isrs) != sorted(p.replicas):
                    problems.append(f"{name}[{number}] leader {p.leader} isr {p.isrs} of {p.replicas}")
        return problems

    def wait_healthy(self, timeout: float = 120) -> None:
        """Until every broker runs and is registered, the quorum has a controller, and every partition's
        ISR is full again."""
        last: list[str] = []

        def healthy() -> bool:
            last.clear()
            down = [n for n in self.nodes if self.pid(n) is None]
            if down:
                last.append(f"brokers {down} are not running")
                return False
            try:
                registered = set(self.admin().list_topics(timeout=10).brokers)
                if registered != set(self.nodes):
                    last.append(f"brokers registered: {sorted(registered)}")
                    return False
                if self.controller_leader() is None:
                    last.append("no active controller")
                    return False
                last.extend(self.under_replicated())
            except Exception as exc:  # the admin client's errors while brokers come back
                last.append(f"metadata: {exc}")
            return not last

        _wait(healthy, timeout, lambda: f"cluster not healthy after {timeout:g} s: {last[:5]}")

    # ------------------------------------------------------------------------------------- helpers

    def admin(self) -> Any:
        """An admin client bootstrapped from the brokers that run and are not paused: a client that
        knows a paused broker keeps sending it metadata requests that only time out."""
        usable = tuple(n for n in self.nodes if n not in self._paused and self.pid(n) is not None)
        usable = usable or self.nodes
        if usable not in self._admins:
            from confluent_kafka.admin import AdminClient

            from onceflow.sources.kafka_clients import kafka_config

            servers = ",".join(f"{self.host}:{self.broker_port(n)}" for n in usable)
            self._admins[usable] = AdminClient(kafka_config(servers))
        return self._admins[usable]

    def _partitions(self, topic: str) -> dict[int, PartitionState]:
        """Leader, ISR and replicas of each partition, from a metadata request to any live broker (the
        admin API's DescribeTopics waits for the controller that librdkafka last saw, maybe a dead one)."""
        found = self.admin().list_topics(topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None:
            raise ClusterError(f"topic {topic!r} is not known to the cluster: {found and found.error}")
        return {
            p.id: PartitionState(int(p.leader), tuple(p.isrs), tuple(p.replicas))
            for p in found.partitions.values()
        }

    def _running(self, node: int) -> int:
        pid = self.pid(node)
        if pid is None:
            raise ClusterError(f"broker {node} is not running")
        return pid

    def _check(self, node: int) -> None:
        if node not in range(1, self.brokers + 1):
            raise ClusterError(f"broker {node}: the cluster has brokers 1..{self.brokers}")

    def _script(self, *args: str) -> str:
        """Run ``infra/kafka.sh ARGS`` on this cluster; its standard output."""
        command = [str(KAFKA_SH), *args]
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            said = done.stderr[-3000:]
            raise ClusterError(f"infra/kafka.sh {' '.join(args)} exited {done.returncode}: {said}")
        return done.stdout


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not reaped yet
    except (OSError, IndexError):
        return False


def _wait(check: Callable[[], bool], timeout: float, failure: str | Callable[[], str]) -> None:
    """Until ``check`` holds; an error it raises (a metadata request that reached a stopped or dying
    broker) counts as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception as exc:  # librdkafka's KafkaException, mostly timeouts
            error = f" (last error: {exc})"
        else:
            error = ""
        if time.monotonic() > deadline:
            raise ClusterError((failure() if callable(failure) else failure) + error)
        time.sleep(0.25)
