"""The clicks example (examples/clicks) as an event-driven DAG: a run starts when the topic has records
beyond the pipeline's committed position, announced by the triggerer (no cron)."""

from onceflow_airflow.dag_factory import ON_NEW_RECORDS, build_dag

dag = build_dag(
    "examples.clicks.pipeline:CLICKS",
    dag_id="onceflow_clicks_on_new_records",
    schedule=ON_NEW_RECORDS,
    tags=("example", "event-driven"),
)
