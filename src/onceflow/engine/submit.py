"""The process step through spark-submit: the command line, its arguments and environment, built once.

The runner's `submit_slice` and the Airflow process operator (a ``SparkSubmitOperator``, built by the DAG
factory) both take the application, its arguments and the Spark settings from here, so the two never
disagree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from onceflow.config import Settings, inherited_environment
from onceflow.errors import OnceflowError, debug_enabled

# Spark's own logging at WARN (ONCEFLOW_DEBUG=1: Spark's default, INFO).
QUIET_LOGGING = Path(__file__).with_name("spark-log4j2.properties")
# Spark settings of every slice job: no UI (one per epoch would be noise), few shuffle partitions, and
# Spark's logging quiet, so that the task log shows the slice's progress.
SPARK_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    **(
        {}
        if debug_enabled()
        else {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{QUIET_LOGGING}"}
    ),
}
# pyspark's switches to Spark Connect mode, which a spark-submit child must not inherit.
CONNECT_MODE_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")
# The entry point's file in a spark_jobs folder, and the folder beside the code in a checkout.
PROCESS_JOB = "onceflow_process.py"
BESIDE_THE_CODE = Path(__file__).resolve().parents[3] / "spark_jobs"


def spark_application(settings: Settings) -> str:
    """The spark-submit entry point, for `onceflow run` and the DAGs alike.

    ``onceflow_process.py`` in the configured folder (`Settings.spark_jobs`) as it is, since the
    process that submits may see folders this one does not (a DAG parsed in another container); else
    the one in the ``spark_jobs/`` folder beside the code (a checkout); else the slice job module itself
    (an installed onceflow), which is the same entry point.
    """
    if settings.spark_jobs is not None:
        return str(settings.spark_jobs / PROCESS_JOB)
    if (BESIDE_THE_CODE / PROCESS_JOB).is_file():
        return str(BESIDE_THE_CODE / PROCESS_JOB)
    from onceflow.engine import slice_job

    return str(Path(slice_job.__file__))


def application_args(pipeline_path: str, epoch: int, slice_number: int, attempt_token: str) -> list[str]:
    """The slice job's own arguments (see `onceflow.engine.slice_job.main`)."""
    return [
        "--pipeline", pipeline_path,
        "--epoch", str(epoch),
        "--slice", str(slice_number),
        "--attempt-token", attempt_token,
    ]  # fmt: skip


def spark_environment(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for spark-submit: ``base`` (default: this process's), the settings, this venv's
    spark-submit and Python (driver and executors), so the pipeline's modules import the same way."""
    env = dict(inherited_environment() if base is None else base)
    # A spark-submit slice job is a classic driver, even when this process also holds a Spark Connect
    # session (pyspark then marks its own environment as Connect mode, which a child would inherit).
    for key in CONNECT_MODE_ENV:
        env.pop(key, None)
    env.update(settings.as_env())
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return env


def submit_command(
    pipeline_path: str,
    epoch: int,
    slice_number: int,
    attempt_token: str,
    settings: Settings,
    *,
    master: str | None = None,
) -> list[str]:
    """spark-submit of one slice on ``master``, default the settings' (``local[N,F]`` lets Spark retry
    a failed task F-1 times)."""
    conf = [part for key, value in SPARK_CONF.items() for part in ("--conf", f"{key}={value}")]
    return [
        "spark-submit",
        "--master", master or settings.spark_master,
        *conf,
        spark_application(settings),
        *application_args(pipeline_path, epoch, slice_number, attempt_token),
    ]  # fmt: skip


class SliceTimedOut(OnceflowError):
    """A spark-submit ran past the pipeline's transaction timeout and was killed, with its children."""


def submit_slice(
    pipeline_path: str,
    epoch: int,
    slice_number: int,
    attempt_token: str,
    settings: Settings,
    *,
    timeout_s: float,
    master: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """spark-submit one slice of an epoch and wait for it, at most ``timeout_s``.

    The bound is the pipeline's transaction timeout: a hung driver would otherwise keep the epoch's
    lease renewed for ever while its prepared transactions hold their locks. Past it the whole process
    group (spark-submit, its JVM and Python workers) is killed, and `SliceTimedOut` says so; what the
    slice staged is rolled back by the abort that follows, or by the sweeper.
    """
    env = spark_environment(settings)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [*sys.path, env.get("PYTHONPATH", "")] if p)
    command = submit_command(pipeline_path, epoch, slice_number, attempt_token, settings, master=master)
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise SliceTimedOut(
                f"spark-submit of slice {slice_number} of epoch {epoch} ran past the pipeline's "
                f"transaction timeout ({timeout_s:g} s) and was killed; the epoch is aborted and replayed"
            ) from None
    return subprocess.CompletedProcess(command, process.returncode, out, err)
