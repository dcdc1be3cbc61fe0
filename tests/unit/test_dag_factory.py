"""The DAG the factory builds for a pipeline spec: its tasks, their order, trigger rules and params."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dag():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "plugins"))
    from onceflow_airflow.dag_factory import build_dag

    return build_dag("examples.orders.pipeline:ORDERS", dag_id="orders_under_test")


def test_one_task_per_step_and_one_spark_submit_per_slice(dag) -> None:  # type: ignore[no-untyped-def]
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    assert sorted(dag.task_ids) == sorted(
        ["recover", "plan", "process_s0", "process_s1", "commit", "report", "abort"]
    )
    assert dag.max_active_runs == 1
    assert dag.get_task("recover").downstream_task_ids == {"plan"}
    assert dag.get_task("plan").downstream_task_ids == {"process_s0", "process_s1"}
    for name in ("process_s0", "process_s1"):
        process = dag.get_task(name)
        assert isinstance(process, SparkSubmitOperator)
        assert process.downstream_task_ids == {"commit", "abort"}
        assert process.retries == 0  # a failed slice aborts the epoch; the next run replays it
        assert process.application.endswith("spark_jobs/onceflow_process.py")
    assert dag.get_task("commit").downstream_task_ids == {"report"}


def test_trigger_rules_and_params(dag) -> None:  # type: ignore[no-untyped-def]
    assert dag.get_task("abort").trigger_rule == "one_failed"
    assert dag.get_task("commit").trigger_rule == "none_failed"  # skipped empty slices are fine
    assert dag.get_task("commit").retries == 2
    assert set(dag.params) == {"max_records_per_partition", "preview", "interval"}
    assert dag.params["preview"] is False
    assert dag.params["interval"] == "auto"


LONGEST = None  # the module:attribute below, set by the test


def test_a_name_whose_pipeline_tag_airflow_would_refuse_is_refused_by_the_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Airflow caps a tag at 100 characters, and each DAG carries ``onceflow:<name>``: the console finds a
    pipeline's DAGs by that whole tag, so a name that does not fit is the spec's error, not the DAG's."""
    import dataclasses

    from airflow.sdk.definitions.dag import TAG_MAX_LEN

    from onceflow.errors import ConfigError
    from onceflow.pipeline import load_pipeline

    sys.path.insert(0, str(ROOT / "plugins"))
    from onceflow_airflow.dag_factory import PIPELINE_TAG, build_dag

    assert len(PIPELINE_TAG) + 91 == TAG_MAX_LEN
    orders = load_pipeline("examples.orders.pipeline:ORDERS")
    longest = "n" * 91
    monkeypatch.setitem(globals(), "LONGEST", dataclasses.replace(orders, name=longest))
    dag = build_dag(f"{__name__}:LONGEST")
    assert f"{PIPELINE_TAG}{longest}" in dag.tags
    with pytest.raises(ConfigError) as raised:
        dataclasses.replace(orders, name=longest + "n")
    assert str(raised.value) == (
        f"name={longest + 'n'!r}: expected [A-Za-z0-9][A-Za-z0-9_.-]*, at most 91 characters (the "
        "Airflow tag onceflow:<name> is at most 100)"
    )
