"""The soak's bookkeeping: records whose producer transaction had an unknown outcome are settled from the
committed input, only the ledger gaps retention made are excused from the contiguity check, a fault that
did not land fails the run, and the curves that must stay flat (the Spark runtime's footprint, each
pipeline's backlog) fail when they grow."""

from __future__ import annotations

import types
from collections.abc import Callable

import pytest

from onceflow.config import Settings
from tests.faults.soak import Soak, SoakFault, fault_violations, without_retention_gaps
from tests.faults.soak_resources import Sample, unbounded
from tests.faults.workload import Workload

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_maybe_records_are_expected_once_if_committed_and_nowhere_if_not(
    settings: Settings, make_topic: Callable[..., str]
) -> None:
    workload = Workload(make_topic("soak-maybe", partitions=3), 3)
    workload.produce(settings.kafka_bootstrap, 30, aborted=3, bad=("wrong_type", "oversized"))
    good, bad = dict(workload.good), dict(workload.bad)
    # As after a commit that timed out: the producer never learnt these records' fate.
    for record_id in range(10, 15):
        del workload.good[record_id]
    del workload.bad[next(p for p, reason in bad.items() if reason == "wrong_type")]
    producer = types.SimpleNamespace(
        maybe_ids={10, 11, 12, 13, 14, 999, 1_000_000}, maybe_bad=["wrong_type", "malformed_json"]
    )
    soak = types.SimpleNamespace(producer=producer, workload=workload, settings=settings)
    Soak.resolve_maybe(soak)  # type: ignore[arg-type]
    assert workload.good == good  # committed ones found at their positions; 999 and aborted ids not
    assert workload.bad == bad
    assert soak.maybe_committed == 6


def test_only_gaps_that_retention_made_are_excused() -> None:
    problems = [
        "right after recover: epoch 11 starts in-x[0]@[738,809) at 738, not at 591",
        "epoch 12 starts in-x[1]@[5,9) at 5, not at 4",
        "prepared transactions left: ['onceflow:p:1']",
    ]
    assert without_retention_gaps(problems, {11}) == problems[1:]
    assert without_retention_gaps(problems, set()) == problems


def test_a_scheduled_fault_that_did_not_land_fails_the_soak() -> None:
    def fault(number: int, fired: bool, leftovers: tuple[str, ...] = ()) -> SoakFault:
        return SoakFault(
            number, 1.0, "crash", "records", "after_decision", fired, ["epoch:-9"], 3.0, [*leftovers]
        )

    assert fault_violations([fault(1, True), fault(2, True)]) == []
    assert fault_violations([fault(1, True), fault(2, False), fault(3, True, ("staging left: x",))]) == [
        "fault 2 (crash on records: after_decision) did not land",
        "fault 3 (after_decision): staging left: x",
    ]


def _sample(
    minute: float,
    pss: float,
    python: int,
    backlog: int,
    files: int = 160,
    sockets: int = 40,
    in_flight: int = 0,
    in_flight_mb: float = 0.0,
    sessions: int = 3,
) -> Sample:
    """``pss`` of the JVMs, ``python`` daemons on 2 executors, plus ``in_flight`` task workers; the Python
    processes hold ``in_flight_mb``."""
    return Sample(
        minute=minute,
        prepared=0,
        staging_bytes=0,
        kafka_open_sink=0,
        kafka_open_workload=0,
        ledger_rows={"epochs": 10},
        pg_connections=3,
        fds={"kafka": files},
        rss_mb={"kafka": 500.0},
        runtime_pss_mb={"connect": pss / 2, "executors": pss / 2, "python": in_flight_mb},
        python_processes=python + in_flight,
        sessions=sessions,
        python_daemons=python,
        executors=2,
        backlog={"records": backlog},
        sockets={"kafka": sockets},
    )


def test_the_runtime_footprint_and_the_backlog_are_bounded_by_their_first_half() -> None:
    # A plateau with a sawtooth passes: the JVMs warmed up, a fault left a minute of input behind.
    flat = [_sample(m, 3000 + 100 * (m % 2), 6, 60_000 * (m == 7)) for m in range(10)]
    assert unbounded(flat) == []
    # The JVMs grow every minute: caught, whatever the first value.
    growing = [_sample(m, 3000 + 400 * m, 6, 20_000) for m in range(10)]
    assert [p.split(" grew")[0] for p in unbounded(growing)] == ["runtime_jvm_pss_mb"]
    # Python daemons and workers at the second half's samples only, none at the first's: they come and
    # go with the epochs in flight, not growth.
    busy_later = [
        _sample(m, 1850, 6 * (m >= 2), 20_000, in_flight=4 * (m >= 2), in_flight_mb=800.0 * (m >= 2))
        for m in range(4)
    ]
    assert unbounded(busy_later) == []
    # More daemons than sessions held on every executor: a daemon outlived its session (SPARK-54055).
    kept = [_sample(m, 1850, 6 + 2 * m, 20_000) for m in range(4)]
    assert unbounded(kept) == [
        "minute 1: 8 Python daemons for 3 sessions on 2 executors",
        "minute 2: 10 Python daemons for 3 sessions on 2 executors",
        "minute 3: 12 Python daemons for 3 sessions on 2 executors",
    ]
    # A pipeline slower than the producer: its backlog climbs past a minute and a half of input.
    behind = [_sample(m, 3000, 6, 30_000 * m) for m in range(10)]
    assert [p.split(" grew")[0] for p in unbounded(behind)] == ["backlog.records"]


def test_a_brokers_clients_come_and_go_but_its_files_are_bounded() -> None:
    # Spark's pooled Kafka consumers fill in after the first minutes of a short run: sockets, not a leak.
    pooled = [_sample(m, 3000, 6, 20_000, sockets=20 if m < 2 else 230) for m in range(4)]
    assert unbounded(pooled) == []
    # Descriptors of files that keep opening (segments, a handle never closed) are caught.
    leaking = [_sample(m, 3000, 6, 20_000, files=160 + 40 * m) for m in range(10)]
    assert [p.split(" grew")[0] for p in unbounded(leaking)] == ["fds.kafka"]
