"""The smoke DAG writes its ``output`` only inside ``$ONCEFLOW_HOME/smoke/``: a param from whoever
triggers the DAG must not choose where the worker writes."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from onceflow.errors import ConfigError

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "onceflow_smoke.py"


@pytest.fixture
def smoke(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    monkeypatch.setenv("ONCEFLOW_HOME", str(tmp_path / "home"))
    spec = importlib.util.spec_from_file_location("onceflow_smoke_dag", DAG_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render_output(smoke: ModuleType, output: str) -> Any:
    """The ``--output`` argument as the task renders it from the DAG run's params."""
    task = smoke.dag.get_task("read_range")
    context = {"params": {"output": output}, **smoke.dag.user_defined_macros}
    return task.render_template(task.application_args[-1], context)


def test_output_is_a_file_in_the_smoke_folder_under_onceflow_home(smoke: ModuleType, tmp_path: Path) -> None:
    folder = tmp_path / "home" / "smoke"
    assert render_output(smoke, "out.json") == str(folder / "out.json")
    assert render_output(smoke, "runs/a.json") == str(folder / "runs" / "a.json")
    assert (folder / "runs").is_dir()
    assert render_output(smoke, str(folder / "b.json")) == str(folder / "b.json")


@pytest.mark.parametrize("output", ["/tmp/out.json", "../ledger.db", "runs/../../x.json", "", "  ", "/"])
def test_anything_outside_the_smoke_folder_is_refused_in_one_line(smoke: ModuleType, output: str) -> None:
    with pytest.raises(ConfigError, match=r"is not a file in .*smoke: give a file name") as refused:
        render_output(smoke, output)
    assert "\n" not in str(refused.value)


def test_a_link_out_of_the_smoke_folder_is_refused(smoke: ModuleType, tmp_path: Path) -> None:
    folder = tmp_path / "home" / "smoke"
    folder.mkdir(parents=True)
    (folder / "elsewhere").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match="is not a file in"):
        render_output(smoke, "elsewhere/out.json")
