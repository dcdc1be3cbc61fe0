"""The soak in the suite: three minutes (ONCEFLOW_SOAK_MINUTES) of steady load (ONCEFLOW_SOAK_RATE good
records a second, 1,000 by default) on every sink kind and keyed state, every pipeline on the warm Spark
runtime, a seeded fault about once a minute (Spark's own among them), each of which must land where it
was aimed, then exactly-once and each source partition's order from the outputs, and bounded resources.

Bounded, concretely (`tests.faults.soak_resources`): at every sample (once a minute, between steps) no
prepared transaction, no staged byte, no open Kafka sink transaction and no more Python daemons than
Connect sessions times executors; ledger rows, PostgreSQL connections, each long-lived process's open files
and sockets, the Spark runtime's JVMs' proportional set size and its Connect sessions peak in the second
half at most 1.25 times their first half's peak (plus a small margin per curve). `make soak MINUTES=60`
runs the long one with a report.
"""

from __future__ import annotations

import os

import pytest

from tests.faults import soak
from tests.faults.spark_faults import SPARK_KINDS

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]

MINUTES = float(os.environ.get("ONCEFLOW_SOAK_MINUTES", "3"))
SEED = int(os.environ.get("ONCEFLOW_SOAK_SEED", "20261205"))
RATE = int(os.environ.get("ONCEFLOW_SOAK_RATE", str(soak.RATE)))


# The soak's own minutes, plus set-up and the catching up at the end (610 s in all for ten minutes).
@pytest.mark.timeout(MINUTES * 60 + 900)
def test_soak_keeps_exactly_once_and_bounded_resources(settings, reports, tmp_path) -> None:
    data, path = soak.run_soak(MINUTES, SEED, RATE, reports, root=tmp_path)
    verdict, resources = data["verdict"], data["resources"]
    assert data["error"] is None
    assert (verdict["lost"], verdict["duplicated_exactly_once"], verdict["aborted_read"]) == (0, 0, 0)
    assert verdict["violations"] == []
    # Every fault the run scheduled landed where it was aimed (an unlanded one is also a violation).
    assert data["faults_fired"] == len(data["faults"]), [f for f in data["faults"] if not f["fired"]]
    assert resources["unbounded"] == []
    # The run did what a soak is for: every pipeline committed epochs throughout, faults of each kind.
    assert data["records"]["good"] >= MINUTES * 60 * RATE * 0.5
    assert all(lane["epochs_committed"] >= MINUTES / 2 for lane in data["lanes"].values())
    assert {lane["executor"] for lane in data["lanes"].values()} == {"connect"}
    kinds = set(soak.KINDS) | set(SPARK_KINDS) | (set(soak.CLUSTER_KINDS) if data["brokers"] >= 3 else set())
    if len(kinds) + 3 <= MINUTES:  # a fault a minute, in rounds that hold each kind once
        assert set(data["faults_per_kind"]) == kinds
    assert len(data["faults"]) >= MINUTES * 0.6
    assert len(resources["samples"]) >= MINUTES
    assert path.read_text().startswith(f"Soak, seed {SEED}")
