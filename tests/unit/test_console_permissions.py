"""The console checks Airflow permissions on the DAGs that run a pipeline (found by `build_dag`'s tag),
never on a DAG id guessed from the pipeline's name."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


class User:
    def get_name(self) -> str:
        return "ann"


class AuthManager:
    """Answers for "every DAG" (no dag id) as told, and records the question."""

    def __init__(self, every_dag: bool) -> None:
        self.every_dag = every_dag
        self.asked: list[tuple[str, Any]] = []

    def is_authorized_dag(self, *, method: str, user: Any, details: Any = None) -> bool:
        self.asked.append((method, details))
        return self.every_dag


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, list[tuple[str, str | None]], set[str]]:
    """The console plugin with the DAG of pipeline ``clicks`` named ``clicks_on_new_records`` and an
    auth manager that allows the DAG ids in the returned set (and records each check)."""
    monkeypatch.syspath_prepend(str(ROOT / "plugins"))
    from fastapi import HTTPException
    from onceflow_airflow import console_plugin

    asked: list[tuple[str, str | None]] = []
    allowed: set[str] = set()

    def requires_access_dag(method: str, param_dag_id: str | None = None) -> Any:
        def check(request: Any, user: Any) -> None:
            asked.append((method, param_dag_id))
            if param_dag_id not in allowed:
                raise HTTPException(403, "no")

        return check

    monkeypatch.setattr(console_plugin, "requires_access_dag", requires_access_dag)
    monkeypatch.setattr(
        console_plugin, "dag_ids_of", lambda p: ["clicks_on_new_records"] if p == "clicks" else []
    )
    return console_plugin, asked, allowed


def test_access_is_checked_on_the_dag_that_runs_the_pipeline(plugin: Any) -> None:
    console_plugin, asked, allowed = plugin
    allowed.add("onceflow_clicks")  # a DAG of the guessed name, which does not run the pipeline
    assert not console_plugin._may("PUT", "clicks", None, User())
    allowed.add("clicks_on_new_records")
    assert console_plugin._may("PUT", "clicks", None, User())
    assert {dag_id for _, dag_id in asked} == {"clicks_on_new_records"}


def test_the_refusal_names_the_pipelines_dag(plugin: Any) -> None:
    from fastapi import HTTPException

    console_plugin, _, _ = plugin
    with pytest.raises(HTTPException) as refused:
        console_plugin._require("GET", "clicks", None, User())
    assert refused.value.status_code == 403
    assert refused.value.detail == "forbidden: ann may not read the DAG 'clicks_on_new_records'"


def test_a_pipeline_without_a_dag_needs_access_to_every_dag(
    plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    console_plugin, asked, _ = plugin
    for every_dag in (False, True):
        manager = AuthManager(every_dag)
        monkeypatch.setattr(console_plugin, "get_auth_manager", lambda manager=manager: manager)
        assert console_plugin._may("PUT", "cli-only", None, User()) is every_dag
        assert manager.asked == [("PUT", None)]
    assert asked == []


def test_every_dag_the_factory_builds_carries_its_pipeline_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "plugins"))
    from onceflow_airflow.dag_factory import PIPELINE_TAG, build_dag

    from onceflow.pipeline import load_pipeline

    dag = build_dag("examples.orders.pipeline:ORDERS", dag_id="any_name_at_all", tags=("mine",))
    name = load_pipeline("examples.orders.pipeline:ORDERS").name
    assert set(dag.tags) == {"onceflow", f"{PIPELINE_TAG}{name}", "mine"}
