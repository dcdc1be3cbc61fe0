"""OpenLineage facets of the DAG's operators, as the openlineage provider's extractor collects them:
the pipeline's topics in, each sink's table, topic or folder out, named after the naming spec."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = {"user_id": "text", "page": "text"}

LINEAGE = Pipeline(
    name="lineage",
    source=KafkaSource(topics=("clicks", "views")),
    format=JsonFormat(schema={"user_id": "string", "page": "string"}),
    sinks=(
        SinkSpec(
            "own_db",
            "postgres_2pc",
            {
                "dsn": "postgresql://u:secret@db.example:5433/shop",
                "table": "sales.clicks",
                "columns": COLUMNS,
            },
        ),
        SinkSpec(
            "default_db", "postgres_upsert", {"table": "pages", "columns": COLUMNS, "key_columns": ["page"]}
        ),
        SinkSpec("parquet", "files", {"root": "/data/lake", "table": "clicks"}),
        SinkSpec("out", "kafka", {"topic": "clicks-clean", "staging_root": "/data/staging"}),
    ),
)


@pytest.fixture
def dag(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(os, "environ", os.environ.copy())
    conns = {
        "onceflow_kafka": {"conn_type": "generic", "extra": {"bootstrap.servers": "k1:9093,k2:9093"}},
        "onceflow_postgres": {"conn_type": "postgres", "host": "pg.example", "port": 5432, "schema": "web"},
        "onceflow_ledger": {"conn_type": "generic", "extra": {"url": "sqlite:////tmp/unused-ledger.db"}},
    }
    for conn_id, conn in conns.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    sys.path.insert(0, str(ROOT / "plugins"))
    from onceflow_airflow.dag_factory import build_dag

    return build_dag(f"{__name__}:LINEAGE", dag_id="lineage_under_test")


@pytest.mark.parametrize("task_id", ["process_s0", "commit"])
def test_inputs_are_the_topics_and_outputs_the_sinks(dag, task_id: str) -> None:  # type: ignore[no-untyped-def]
    from airflow.providers.openlineage.extractors.base import DefaultExtractor

    lineage = DefaultExtractor(dag.get_task(task_id)).extract_on_complete(None)
    assert lineage is not None
    assert [(d.namespace, d.name) for d in lineage.inputs] == [
        ("kafka://k1:9093", "clicks"),
        ("kafka://k1:9093", "views"),
    ]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [
        ("postgres://db.example:5433", "shop.sales.clicks"),
        ("postgres://pg.example:5432", "web.public.pages"),
        ("file", "/data/lake/clicks"),
        ("kafka://k1:9093", "clicks-clean"),
    ]


def test_steps_without_data_have_no_lineage(dag) -> None:  # type: ignore[no-untyped-def]
    from airflow.providers.openlineage.extractors.base import DefaultExtractor

    for task_id in ("recover", "plan", "report", "abort"):
        assert not hasattr(dag.get_task(task_id), "get_openlineage_facets_on_complete")
        lineage = DefaultExtractor(dag.get_task(task_id)).extract_on_complete(None)
        assert lineage is None or (not lineage.inputs and not lineage.outputs)
