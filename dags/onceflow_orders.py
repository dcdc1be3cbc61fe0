"""The orders example pipeline (examples/orders) as an hourly DAG: one run, one epoch per hour of data."""

from airflow.timetables.interval import CronDataIntervalTimetable
from onceflow_airflow.dag_factory import build_dag

dag = build_dag(
    "examples.orders.pipeline:ORDERS",
    dag_id="onceflow_orders",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    tags=("example",),
)
