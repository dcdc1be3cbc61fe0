"""``build_dag(..., schedule=ON_NEW_RECORDS)``: an asset whose watcher is onceflow's trigger, which the
triggerer can rebuild from its serialized form."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dag_is_scheduled_on_an_asset_watched_by_the_new_records_trigger() -> None:
    sys.path.insert(0, str(ROOT / "plugins"))
    from airflow.sdk.module_loading import import_string
    from airflow.triggers.base import BaseEventTrigger
    from onceflow_airflow.dag_factory import ON_NEW_RECORDS, build_dag

    dag = build_dag("examples.clicks.pipeline:CLICKS", schedule=ON_NEW_RECORDS, poll_interval_s=2.0)
    assert dag.max_active_runs == 1  # events that arrive during a run wait for it, as one queued run
    (asset,) = dag.timetable.asset_condition.objects
    assert asset.name == "onceflow_clicks_new_records"
    assert asset.uri == "onceflow://clicks/new-records"
    (watcher,) = asset.watchers
    classpath, kwargs = watcher.trigger.serialize()
    assert classpath == "onceflow_airflow.triggers.NewRecordsTrigger"
    rebuilt = import_string(classpath)(**kwargs)
    assert isinstance(rebuilt, BaseEventTrigger)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs["pipeline"] == "examples.clicks.pipeline:CLICKS"
    assert kwargs["poll_interval_s"] == 2.0
    assert kwargs["ledger_conn_id"] == "onceflow_ledger"
