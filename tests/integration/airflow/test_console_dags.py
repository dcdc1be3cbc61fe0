"""The epochs console finds a pipeline's DAGs in Airflow's metadata DB by the tag `build_dag` puts on
each, whatever its dag_id, and never takes a DAG named ``onceflow_<pipeline>`` for the pipeline's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from onceflow.config import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
SPEC = "tests.integration.airflow.console_pipeline:CONSOLE"
CUSTOM = (
    'from onceflow_airflow.dag_factory import build_dag\n\ndag = build_dag("{spec}", dag_id="{dag_id}")\n'
)
DECOY = (
    "from airflow.providers.standard.operators.empty import EmptyOperator\n"
    "from airflow.sdk import DAG\n\n"
    'with DAG(dag_id="{dag_id}", schedule=None, tags=["onceflow"]) as dag:\n'
    '    EmptyOperator(task_id="nothing")\n'
)
PROBE = """
import json, sys
from onceflow_airflow.console_plugin import dag_ids_of, pipeline_of
pipeline, custom, decoy = sys.argv[1:]
print(json.dumps({"dags": dag_ids_of(pipeline), "custom": pipeline_of(custom), "decoy": pipeline_of(decoy)}))
"""


def test_a_pipelines_dags_are_found_by_the_factorys_tag_not_by_their_name(
    tmp_path: Path, settings: Settings
) -> None:
    from local_stack.local_airflow import airflow_environment, migrate, run_airflow

    pipeline = f"perm-{uuid.uuid4().hex[:8]}"
    custom, decoy = f"clicks_by_another_name_{pipeline}", f"onceflow_{pipeline}"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "custom.py").write_text(CUSTOM.format(spec=SPEC, dag_id=custom))
    (dags / "decoy.py").write_text(DECOY.format(dag_id=decoy))
    ours = {"ONCEFLOW_CONSOLE_PIPELINE": pipeline, "ONCEFLOW_CONSOLE_FILES": str(tmp_path / "files")}
    env = airflow_environment(settings, ROOT, tmp_path / "airflow-home", {**os.environ, **ours})
    env.update({**ours, "AIRFLOW__CORE__DAGS_FOLDER": str(dags)})
    migrate(env)
    run_airflow(["dags", "reserialize"], env, timeout=300)
    # The API server imports the plugin from its plugins folder; the probe, as a module.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "plugins"), env["PYTHONPATH"]])
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, pipeline, custom, decoy],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found == {"dags": [custom], "custom": pipeline, "decoy": None}
