"""A one-task DAG that checks the Airflow -> spark-submit -> executors -> Kafka path end to end.

Trigger it with the range to read, e.g. ``airflow dags test onceflow_smoke --conf '{"topic": "t",
"partition": 0, "from_offset": 0, "until_offset": 100, "output": "/tmp/out.json"}'``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param

from onceflow.config import Settings

# The configured spark_jobs folder (ONCEFLOW_SPARK_JOBS), else the one beside this dags/ folder.
SPARK_JOBS = Settings.from_env().spark_jobs or Path(__file__).resolve().parents[1] / "spark_jobs"

with DAG(
    dag_id="onceflow_smoke",
    schedule=None,
    catchup=False,
    tags=["onceflow", "smoke"],
    params={
        "topic": Param("", type="string"),
        "partition": Param(0, type="integer", minimum=0),
        "from_offset": Param(0, type="integer", minimum=0),
        "until_offset": Param(0, type="integer", minimum=0),
        "read_tasks": Param(2, type="integer", minimum=1),
        "output": Param("", type="string"),
    },
) as dag:
    SparkSubmitOperator(
        task_id="read_range",
        application=str(SPARK_JOBS / "smoke_read_range.py"),
        conn_id="spark_default",
        name="onceflow-smoke",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
        env_vars={"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable},
        application_args=[
            "--topic",
            "{{ params.topic }}",
            "--partition",
            "{{ params.partition }}",
            "--from-offset",
            "{{ params.from_offset }}",
            "--until-offset",
            "{{ params.until_offset }}",
            "--read-tasks",
            "{{ params.read_tasks }}",
            "--output",
            "{{ params.output }}",
        ],
    )
