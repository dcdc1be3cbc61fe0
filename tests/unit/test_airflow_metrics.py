"""onceflow's metrics through Airflow's own StatsD client, read back from a local UDP socket.

The Stats object is Airflow's (``airflow.sdk.observability.stats``), set up the way Airflow's task runner
sets it up (`get_stats_factory` from the ``[metrics]`` settings), pointed at a socket of this test.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.decoding.records import DeadLetter
from onceflow.ledger import Ledger
from onceflow.monitoring.metrics import epoch_metrics, lag_metrics, step_metric
from onceflow.monitoring.new_records import backlog_of
from onceflow.offsets import OffsetRange
from onceflow.pipeline import KafkaSource
from onceflow.sinks.base import Committable
from onceflow.sources.kafka_planning import PartitionOffsets
from onceflow.testing import RecordingCommitter, coordinator_for_tests

ROOT = Path(__file__).resolve().parents[2]
P = "clicks.eu"  # a dot of its own must not add a level to the metric names


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """Airflow's Stats sending StatsD datagrams to a UDP socket that the test reads."""
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    sys.path.insert(0, str(ROOT / "plugins"))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(2.0)
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(sock.getsockname()[1]))
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PREFIX", "airflow")
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    yield sock
    sock.close()
    stats.initialize(factory=stats_utils.NoStatsLogger, export_legacy_names=False)


def _received(sock: socket.socket, count: int) -> list[str]:
    lines: list[str] = []
    while len(lines) < count:
        lines += sock.recv(65536).decode().splitlines()
    return lines


@pytest.fixture
def committed_epoch(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real ledger with one committed epoch: 10 offsets read, 7 rows in the sink, 2 dead letters."""
    ledger = Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}", check=False)
    ledger.upgrade()
    epoch = ledger.plan_epoch(
        P,
        [OffsetRange("clicks", 0, 0, 6), OffsetRange("clicks", 1, 0, 4)],
        [("pg", "s0-t0"), ("pg", "s0-t1")],
    )
    sink = RecordingCommitter()
    committables = [
        Committable(P, epoch.number, 0, task, "a0", "pg", record_count=rows)
        for task, rows in (("s0-t0", 4), ("s0-t1", 3))
    ]
    for c in committables:
        sink.stage(c)
    letters = [
        DeadLetter("clicks", 0, 5, b"k", b"{bad", "malformed_json: x"),
        DeadLetter("clicks", 1, 0, None, None, "null_value: y"),
    ]
    ledger.precommit_slice(P, epoch.number, epoch.attempt_token, committables, letters)
    done = coordinator_for_tests(ledger, P, {"pg": sink}).commit(number=epoch.number)
    yield ledger, done
    ledger.close()


def test_an_epochs_figures_arrive_as_statsd_metrics_named_by_pipeline(statsd, committed_epoch) -> None:  # type: ignore[no-untyped-def]
    from onceflow_airflow.metrics import emit

    ledger, epoch = committed_epoch
    metrics = epoch_metrics(ledger, epoch)
    assert emit(metrics) == len(metrics) == 5
    lines = _received(statsd, 5)
    assert lines[:4] == [
        "airflow.onceflow.clicks_eu.epochs.committed:1|c",
        "airflow.onceflow.clicks_eu.offsets:10|c",
        "airflow.onceflow.clicks_eu.dead_letters:2|c",
        "airflow.onceflow.clicks_eu.rows.pg:7|c",
    ]
    name, value = lines[4].removesuffix("|ms").split(":")
    assert name == "airflow.onceflow.clicks_eu.epoch.duration"
    assert 0 <= float(value) < 60_000


def test_step_durations_and_lag(statsd) -> None:  # type: ignore[no-untyped-def]
    from onceflow_airflow.metrics import emit

    backlog = backlog_of(
        P,
        KafkaSource(topics=("clicks",)),
        [PartitionOffsets("clicks", 0, 0, 9), PartitionOffsets("clicks", 1, 0, 4)],
        {("clicks", 0): 6, ("clicks", 1): 4},
    )
    emit([step_metric(P, "process", 1.5, slice="0"), *lag_metrics(backlog)])
    assert _received(statsd, 4) == [
        "airflow.onceflow.clicks_eu.process.duration:1500.000000|ms",
        "airflow.onceflow.clicks_eu.lag:3|g",
        "airflow.onceflow.clicks_eu.lag.clicks.0:3|g",
        "airflow.onceflow.clicks_eu.lag.clicks.1:0|g",
    ]
    with pytest.raises(ValueError, match="step 'prepare'"):
        step_metric(P, "prepare", 1.0)


def test_an_aborted_epoch_counts_as_aborted_and_nothing_else(statsd, committed_epoch) -> None:  # type: ignore[no-untyped-def]
    from onceflow_airflow.metrics import emit

    ledger, _ = committed_epoch
    epoch = ledger.plan_epoch(P, [OffsetRange("clicks", 0, 6, 8)], [("pg", "s0-t0")])
    aborted = coordinator_for_tests(ledger, P, {"pg": RecordingCommitter()}).abort(
        number=epoch.number, reason="test"
    )
    assert aborted is not None
    emit(epoch_metrics(ledger, aborted))
    assert _received(statsd, 1) == ["airflow.onceflow.clicks_eu.epochs.aborted:1|c"]
