"""A pipeline whose PostgreSQL sinks (one of each kind) use mixed-case and schema-qualified table and
marker names, named from the scenario's environment (`ONCEFLOW_FAULTS_SCHEMA`, `ONCEFLOW_FAULTS_TABLE`)."""

from __future__ import annotations

import os
from pathlib import Path

from onceflow.pipeline import KafkaSource, Pipeline, SinkSpec
from tests.faults.pipelines import FORMAT, MAX_RECORD_BYTES

COLUMNS = {"id": "bigint", "payload": "text"}


def names_pipeline() -> Pipeline:
    env = os.environ
    schema = env.get("ONCEFLOW_FAULTS_SCHEMA", "Faults_Names")
    table = env.get("ONCEFLOW_FAULTS_TABLE", "Names")
    root = Path(env.get("ONCEFLOW_FAULTS_ROOT", "/tmp/onceflow-faults"))
    return Pipeline(
        name=env.get("ONCEFLOW_FAULTS_NAME", "faults-names"),
        source=KafkaSource(topics=(env.get("ONCEFLOW_FAULTS_TOPIC", "faults-in"),)),
        format=FORMAT,
        guarantee="at_least_once",  # plain and wal are at-least-once sinks
        sinks=(
            # Sorted by name, the two-phase sinks commit first: the crash comes after their COMMIT PREPARED.
            SinkSpec(
                "a_two_phase",
                "postgres_2pc",
                {"table": f"{schema}.TwoPhase", "columns": COLUMNS, "marker_table": f"{schema}.Markers"},
            ),
            SinkSpec(
                "b_two_phase",
                "postgres_2pc",
                {"table": f"{table}_TwoPhase", "columns": COLUMNS, "marker_table": f"{table}_Markers"},
            ),
            SinkSpec(
                "c_upsert",
                "postgres_upsert",
                {"table": f"{schema}.Upsert", "columns": COLUMNS, "key_columns": ["id"]},
            ),
            SinkSpec("d_plain", "plain", {"table": f"{schema}.Plain", "columns": COLUMNS}),
            SinkSpec(
                "e_wal", "wal", {"root": str(root / "wal"), "table": f"{schema}.Wal", "columns": COLUMNS}
            ),
        ),
        max_record_bytes=MAX_RECORD_BYTES,
    )


NAMES = names_pipeline()
