"""The page views example pipeline (examples/pageviews) as a DAG with ten-minute data intervals."""

from airflow.timetables.interval import CronDataIntervalTimetable
from onceflow_airflow.dag_factory import build_dag

dag = build_dag(
    "examples.pageviews.pipeline:PAGEVIEWS",
    dag_id="onceflow_pageviews",
    schedule=CronDataIntervalTimetable("*/10 * * * *", timezone="UTC"),
    tags=("example",),
)
