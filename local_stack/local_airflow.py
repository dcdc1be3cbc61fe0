"""Run Airflow CLI commands against a local Airflow home that knows onceflow's DAGs and the local stack.

Used by `make demo` and the tests, which drive Airflow through its own CLI (`airflow dags test`) rather
than importing it, so that they exercise exactly what an operator runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from onceflow.config import Settings
from onceflow.engine.submit import spark_environment
from onceflow.errors import OnceflowError

# The local Spark "cluster": spark-submit runs the driver here and executors in threads.
LOCAL_SPARK_CONNECTION = '{"conn_type": "spark", "host": "local[2]"}'
# KEY=VALUE lines in ONCEFLOW_HOME that the example pipelines read (written by `make demo`, so that
# `make airflow-ui` shows the demo's topics and tables).
EXAMPLES_ENV = "examples.env"
# The example DAGs' pipelines, which the epochs console and the CLI act on by name in `make airflow-ui`.
EXAMPLE_PIPELINES = (
    "examples.orders.pipeline:ORDERS,examples.pageviews.pipeline:PAGEVIEWS,"
    "examples.odd_even.pipeline:ODD_EVEN,examples.clicks.pipeline:CLICKS"
)


def examples_environment(home: Path) -> dict[str, str]:
    path = home / EXAMPLES_ENV
    if not path.is_file():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def airflow_environment(
    settings: Settings, project_root: Path, airflow_home: Path, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment for `airflow` subprocesses: spark_environment() plus the repo's dags/ and plugins/."""
    env = spark_environment(settings, base)
    env.update(
        {
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(project_root / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(project_root / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "ONCEFLOW_SPARK_JOBS": str(project_root / "spark_jobs"),
            # examples/ (the example pipelines) must be importable by tasks and by spark-submit.
            "PYTHONPATH": os.pathsep.join(p for p in (str(project_root), env.get("PYTHONPATH", "")) if p),
        }
    )
    env.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", LOCAL_SPARK_CONNECTION)
    return env


def run_airflow(
    args: Sequence[str], env: Mapping[str, str], *, timeout: float = 900, capture: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `airflow ARGS...`; raise with the tail of its output when it fails."""
    airflow = str(Path(sys.executable).parent / "airflow")
    result = subprocess.run(
        [airflow, *args], env=dict(env), capture_output=capture, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        tail = ((result.stdout or "") + (result.stderr or ""))[-4000:]
        raise OnceflowError(f"`airflow {' '.join(args)}` exited with {result.returncode}:\n{tail}")
    return result


def migrate(env: Mapping[str, str]) -> None:
    """Create or upgrade Airflow's metadata DB in AIRFLOW_HOME (idempotent)."""
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    run_airflow(["db", "migrate"], env, timeout=300)


def start_servers(
    env: Mapping[str, str], logs: Path, commands: Iterable[Sequence[str]]
) -> list[subprocess.Popen[bytes]]:
    """Start Airflow servers (``["api-server", "--port", P]``, ``["scheduler"]``...), each in a session of
    its own so that `stop_process_groups` also stops the workers it forks; each logs to logs/<name>.log."""
    airflow = str(Path(sys.executable).parent / "airflow")
    logs.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [airflow, *args],
            env=dict(env),
            stdout=(logs / f"{args[0]}.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for args in commands
    ]


def stop_process_groups(procs: Iterable[subprocess.Popen[bytes] | subprocess.Popen[str]]) -> None:
    """Stop Airflow servers started with ``start_new_session=True``: SIGTERM to each process group (a
    server and the workers it forked), then SIGKILL to a group still there after 30 s."""
    procs = list(procs)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m local_stack.local_airflow ARGS...`: run `airflow ARGS...` in the local environment."""
    args = list(sys.argv[1:] if argv is None else argv)
    settings = Settings.from_env()
    root = Path(__file__).resolve().parents[1]
    # Variables already set in the environment win over the demo's examples.env.
    base = {**examples_environment(settings.home), **os.environ}
    env = airflow_environment(settings, root, settings.home / "airflow", base)
    env.setdefault("ONCEFLOW_PIPELINES", EXAMPLE_PIPELINES)
    migrate(env)
    airflow = str(Path(sys.executable).parent / "airflow")
    return subprocess.run([airflow, *args], env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
