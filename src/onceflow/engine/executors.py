"""Where a slice runs, decided in one place for every door (``onceflow run`` and the DAG's process task).

Both decide from the same two inputs: the configured executor (`Settings.executor`, or ``onceflow run
--executor``) and the Spark Connect server if there is one (`Settings.spark_remote`, or for a DAG the
``spark_connect`` connection's URL first). So a deployment's ``ONCEFLOW_EXECUTOR`` means the same thing
in a terminal and in Airflow.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from onceflow.config import EXECUTORS, Executor, Settings
from onceflow.errors import ConfigError

SliceRunner: TypeAlias = Literal["connect", "submit", "local"]

__all__ = ["EXECUTORS", "Executor", "SliceRunner", "slice_runner", "slice_runner_for"]


def slice_runner(executor: Executor, remote: str | None) -> SliceRunner:
    """How slices run: ``spark`` means the Spark Connect server when one is configured, else
    spark-submit; ``connect`` without a server is refused (it would silently fall back otherwise)."""
    if executor == "connect" and remote is None:
        raise ConfigError(
            "executor 'connect' needs a Spark Connect server: set ONCEFLOW_SPARK_REMOTE=sc://host:port "
            "(infra/spark.sh start starts one and prints it) or, in Airflow, a spark_connect connection"
        )
    if executor == "spark":
        return "connect" if remote is not None else "submit"
    return executor


def slice_runner_for(
    settings: Settings, *, executor: Executor | None = None, remote: str | None = None
) -> tuple[SliceRunner, str | None]:
    """How slices run for this deployment, and on which server: ``executor`` (a command's option) over
    the settings' executor, ``remote`` (a ``spark_connect`` connection's URL, ``onceflow run``'s
    server) over the settings' remote. What ``onceflow run`` and the DAG's process task both call."""
    server = remote or settings.spark_remote
    return slice_runner(executor or settings.executor, server), server
