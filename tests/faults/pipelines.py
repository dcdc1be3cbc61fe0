"""The pipelines the fault harness runs, named from environment variables so that every scenario (and
the spark-submit or driver processes it starts, which import this module by its dotted path) works on
its own fresh topics, tables and folders."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from onceflow.config import Settings
from onceflow.pipeline import AvroFormat, Debezium, JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.iceberg import default_catalog_properties

# The record every workload produces: its id, a payload, and its Kafka key in column "k".
FORMAT = JsonFormat(schema={"id": "int", "payload": "string"}, key_field="k")
# The same records in the schema registry's wire format (ONCEFLOW_FAULTS_FORMAT=avro): the reader schema
# is the subject's latest, which each slice pins from the registry (`tests.faults.workload.avro_registry`).
AVRO_SUBJECT = "faults-records-value"
AVRO_FORMAT = AvroFormat(subject=AVRO_SUBJECT, key_field="k")
MAX_RECORD_BYTES = 2048
SOCKET_TOPIC = "socket"
ICEBERG_COLUMNS = {"id": "long", "payload": "string", "_partition": "int", "_offset": "long"}


def _reader(env: Mapping[str, str] | None) -> Callable[[str, str], str]:
    source = os.environ if env is None else env
    return lambda name, default: source.get(f"ONCEFLOW_FAULTS_{name}", default)


def _s3_root(env: Mapping[str, str] | None, name: str) -> str:
    """ONCEFLOW_FAULTS_S3_ROOT, or a prefix named after the pipeline in the stack's one bucket
    (infra/s3.sh): each scenario's pipeline has a name of its own, so its objects never meet another's."""
    source = os.environ if env is None else env
    bucket = source.get("ONCEFLOW_S3_BUCKET", "onceflow")
    return source.get("ONCEFLOW_FAULTS_S3_ROOT") or f"s3://{bucket}/{name}"


def _iceberg_in_bucket(env: Mapping[str, str] | None, name: str) -> dict[str, str]:
    """The default catalog (SQLite under the scenario's ONCEFLOW_HOME, so each scenario has its own) with
    its warehouse in the bucket, beside the files table of `_s3_root`."""
    home = Settings.from_env(os.environ if env is None else env).home
    return {**default_catalog_properties(home), "warehouse": f"{_s3_root(env, name)}/warehouse"}


def records_pipeline(env: Mapping[str, str] | None = None) -> Pipeline:
    """Every record to PostgreSQL (two-phase commit), Parquet files in a folder and in the stack's bucket
    (`_s3_root`), an Iceberg table whose warehouse is in that bucket too, a Delta table and a Kafka topic;
    through the transform ONCEFLOW_FAULTS_TRANSFORM names (module:function), if any; JSON records, or Avro
    ones with ONCEFLOW_FAULTS_FORMAT=avro."""
    _env = _reader(env)
    root = Path(_env("ROOT", "/tmp/onceflow-faults"))
    name = _env("NAME", "faults")
    return Pipeline(
        name=name,
        source=KafkaSource(topics=(_env("TOPIC", "faults-in"),)),
        format=AVRO_FORMAT if _env("FORMAT", "json") == "avro" else FORMAT,
        transform=_env("TRANSFORM", "") or None,
        sinks=(
            SinkSpec(
                "pg",
                "postgres_2pc",
                {
                    "table": _env("TABLE", "faults_records"),
                    "columns": {
                        "id": "bigint",
                        "payload": "text",
                        "_partition": "integer",
                        "_offset": "bigint",
                    },
                },
            ),
            SinkSpec("files", "files", {"root": str(root / "files"), "table": "records"}),
            # The same table in the object store: data objects written in place, committed by a log entry.
            SinkSpec("files_s3", "files", {"root": _s3_root(env, name), "table": "records"}),
            # Its catalog under the scenario's home, its metadata and data files in the bucket.
            SinkSpec(
                "iceberg",
                "iceberg",
                {
                    "table": "faults.records",
                    "columns": ICEBERG_COLUMNS,
                    "catalog_properties": _iceberg_in_bucket(env, name),
                },
            ),
            # The same columns, so each data file's source order is checked as the Iceberg table's is.
            SinkSpec("delta", "delta", {"path": str(root / "delta" / "records"), "columns": ICEBERG_COLUMNS}),
            SinkSpec(
                "kafka",
                "kafka",
                {
                    "topic": _env("OUT_TOPIC", "faults-out"),
                    "staging_root": str(root / "kafka"),
                    "value_format": "json",
                    "key_column": "_partition",
                },
            ),
        ),
        slices=int(_env("SLICES", "2")),
        max_records_per_partition=int(_env("MAX_RECORDS", "100000")),
        max_records_per_task=int(_env("TASK_RECORDS", "25")),
        max_record_bytes=MAX_RECORD_BYTES,
    )


def table_pipeline(env: Mapping[str, str] | None = None) -> Pipeline:
    """One sink of each kind of the consistency table (PostgreSQL, an Iceberg table and a Delta table), fed
    the same records."""
    _env = _reader(env)
    root = Path(_env("ROOT", "/tmp/onceflow-faults"))
    table = _env("TABLE", "faults_table")
    columns = {"id": "bigint", "payload": "text"}
    return Pipeline(
        name=_env("NAME", "faults-table"),
        source=KafkaSource(topics=(_env("TOPIC", "faults-in"),)),
        format=FORMAT,
        guarantee="at_least_once",
        sinks=(
            SinkSpec("plain", "plain", {"table": f"{table}_plain", "columns": columns}),
            SinkSpec(
                "idempotent",
                "postgres_upsert",
                {"table": f"{table}_idempotent", "columns": columns, "key_columns": ["id"]},
            ),
            SinkSpec("wal", "wal", {"root": str(root / "wal"), "table": f"{table}_wal", "columns": columns}),
            SinkSpec("two_phase", "postgres_2pc", {"table": f"{table}_two_phase", "columns": columns}),
            SinkSpec("iceberg", "iceberg", {"table": "faults.table", "columns": ICEBERG_COLUMNS}),
            SinkSpec("delta", "delta", {"path": str(root / "delta" / table), "columns": ICEBERG_COLUMNS}),
        ),
        max_records_per_partition=int(_env("MAX_RECORDS", "100000")),
        max_record_bytes=MAX_RECORD_BYTES,
    )


def keep_every_record(frame):  # type: ignore[no-untyped-def]
    """A transform that keeps each partition's rows where they are (a filter that drops none of the
    workload's records, and a projection): with it, the records pipeline runs on Spark in one pass."""
    return frame.where(frame.id >= 0).select(*frame.columns)


RECORDS = records_pipeline()
TABLE = table_pipeline()


# The CDC pipeline's rows: the columns of `tests.cdc.source_table`, read from Debezium's JSON events.
CDC_SCHEMA = {
    "id": "int",
    "name": "string",
    "qty": "int?",
    "price": "decimal(10,2)?",
    "updated_at": "timestamp",
}
CDC_COLUMNS = {
    "id": "bigint",
    "name": "text",
    "qty": "bigint",
    "price": "numeric(10,2)",
    "updated_at": "timestamptz",
}


def cdc_pipeline(env: Mapping[str, str] | None = None) -> Pipeline:
    """Debezium's change events of one source table (topic ONCEFLOW_FAULTS_TOPIC) applied by key to a
    PostgreSQL mirror (`postgres_changes`, table ONCEFLOW_FAULTS_TABLE) and appended to a change log (the
    files sink): two sinks, so every commit-side crash point has a place to fire. Small read tasks put
    changes of one key into several tasks of an epoch."""
    _env = _reader(env)
    root = Path(_env("ROOT", "/tmp/onceflow-faults"))
    return Pipeline(
        name=_env("NAME", "faults-cdc"),
        source=KafkaSource(topics=(_env("TOPIC", "faults-cdc-in"),)),
        format=JsonFormat(schema=CDC_SCHEMA, changes=Debezium(key=("id",))),
        sinks=(
            SinkSpec("log", "files", {"root": str(root / "files"), "table": "log"}),
            SinkSpec(
                "mirror",
                "postgres_changes",
                {"table": _env("TABLE", "faults_cdc_mirror"), "columns": CDC_COLUMNS, "key_columns": ["id"]},
            ),
        ),
        max_records_per_partition=int(_env("MAX_RECORDS", "100000")),
        max_records_per_task=int(_env("TASK_RECORDS", "3")),
        max_record_bytes=8192,
    )


CDC = cdc_pipeline()
