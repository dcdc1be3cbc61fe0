"""A one-task DAG that checks the Airflow -> spark-submit -> executors -> Kafka path end to end.

Trigger it with the range to read, e.g. ``airflow dags test onceflow_smoke --conf '{"topic": "t",
"partition": 0, "from_offset": 0, "until_offset": 100, "output": "out.json"}'``.

The ``output`` param names a file in ``$ONCEFLOW_HOME/smoke/`` (the folder is created): whoever may
trigger the DAG chooses the name, not where the worker writes. Anything outside that folder is refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param

from onceflow.config import Settings

# The configured spark_jobs folder (ONCEFLOW_SPARK_JOBS), else the one beside this dags/ folder.
SPARK_JOBS = Settings.from_env().spark_jobs or Path(__file__).resolve().parents[1] / "spark_jobs"


def smoke_output(output: str) -> str:
    """The file ``output`` names inside ``$ONCEFLOW_HOME/smoke/`` (a name, a relative path, or an absolute
    path already in that folder); anything else is refused with one line, before spark-submit starts."""
    from onceflow.config import Settings
    from onceflow.errors import ConfigError

    folder = (Settings.from_env().home / "smoke").resolve()
    target = (folder / output.strip()).resolve() if output.strip() else folder
    if target == folder or not target.is_relative_to(folder):
        raise ConfigError(
            f"onceflow_smoke: output {output!r} is not a file in {folder}: give a file name such as out.json"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    return str(target)


with DAG(
    dag_id="onceflow_smoke",
    schedule=None,
    catchup=False,
    tags=["onceflow", "smoke"],
    user_defined_macros={"smoke_output": smoke_output},
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
            "{{ smoke_output(params.output) }}",
        ],
    )
