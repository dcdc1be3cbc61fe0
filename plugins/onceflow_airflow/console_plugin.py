"""The epochs console inside Airflow 3: a FastAPI app under the API server, a nav entry, a DAG-run tab.

Thin on purpose: what it shows comes from `onceflow.console.read_model`, what it does from
`onceflow.console.actions` (the same `Coordinator` calls as the CLI), the page from `onceflow.console.page`.
This module only wires them to Airflow:

* ``fastapi_apps`` mounts `app` at ``/onceflow`` on the API server (the JSON API under ``/onceflow/api``,
  the page at ``/onceflow/``, a run's epoch at ``/onceflow/run``);
* every route resolves the caller with Airflow's own ``get_user`` (the UI's session cookie or a
  ``Bearer`` token; neither: 401, and the page sends the browser to the login page) and checks the
  pipeline's DAGs with Airflow's ``requires_access_dag``: reads need GET (DAG read), commit / abort /
  recover need PUT (DAG edit) on one of them; the auth manager in use decides (403 otherwise). A
  pipeline's DAGs are those `build_dag` tagged ``onceflow:<pipeline>`` (whatever their dag_id), read
  from Airflow's metadata DB; a pipeline without a DAG needs that access to every DAG;
* ``external_views`` adds "Epochs" to the navigation and an "Epoch" tab to every DAG run's page.

The ledger is the one the DAGs use: `OnceflowHook` (the ``onceflow_ledger`` connection, then
ONCEFLOW_LEDGER_URL); acting needs the pipeline's spec in ONCEFLOW_PIPELINES, as the CLI does.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.core_api.security import GetUserDep, get_user, requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from fastapi import Body, Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from onceflow import redact
from onceflow.config import Settings
from onceflow.console import actions, page, read_model
from onceflow.errors import OnceflowError, one_line
from onceflow.ledger import Ledger
from onceflow_airflow.dag_factory import PIPELINE_TAG
from onceflow_airflow.hooks import OnceflowHook

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.base_auth_manager import ResourceMethod

URL_PREFIX = "/onceflow"
STATIC = Path(__file__).resolve().parent / "console"
NAV_ROUTE = "onceflow-epochs"

app = FastAPI(title="onceflow epochs console", docs_url=None, redoc_url=None, openapi_url=None)
app.mount("/static", StaticFiles(directory=STATIC), name="onceflow-console-static")


def dag_ids_of(pipeline: str) -> list[str]:
    """The DAGs that run ``pipeline``: those `build_dag` tagged with its name (not stale), sorted.

    Read from the DAGs themselves, not guessed from the name: `build_dag` takes any dag_id, and a DAG
    named ``onceflow_<pipeline>`` may run something else."""
    from airflow.models.dag import DagModel, DagTag
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        found = session.scalars(
            select(DagTag.dag_id)
            .join(DagModel, DagModel.dag_id == DagTag.dag_id)
            .where(DagTag.name == f"{PIPELINE_TAG}{pipeline}", DagModel.is_stale.is_(False))
            .order_by(DagTag.dag_id)
        )
        return list(found)


def dag_id_of(pipeline: str) -> str:
    """The pipeline's DAG for links (the first of `dag_ids_of`), or "" when no DAG runs it."""
    return next(iter(dag_ids_of(pipeline)), "")


def pipeline_of(dag_id: str) -> str | None:
    """The pipeline a DAG runs, from its `build_dag` tag; None for any other DAG."""
    from airflow.models.dag import DagTag
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        tags = session.scalars(select(DagTag.name).where(DagTag.dag_id == dag_id)).all()
    names = sorted(t[len(PIPELINE_TAG) :] for t in tags if t.startswith(PIPELINE_TAG))
    return names[0] if names else None


def _settings() -> Settings:
    return OnceflowHook().settings()


@functools.lru_cache(maxsize=4)
def _ledger(url: str) -> Ledger:
    """One ledger (engine and connection pool) per URL for the life of the API server."""
    return Ledger.connect(url)


def _may(method: ResourceMethod, pipeline: str, request: Request, user: BaseUser) -> bool:
    """Whether ``user`` has ``method`` access to one of the pipeline's DAGs (to every DAG, when no DAG
    runs the pipeline: only such users may act on a pipeline run from the CLI alone)."""
    dag_ids = dag_ids_of(pipeline)
    if not dag_ids:
        return get_auth_manager().is_authorized_dag(method=method, user=user)
    for dag_id in dag_ids:
        try:
            requires_access_dag(method, param_dag_id=dag_id)(request, user)
        except HTTPException:
            continue
        return True
    return False


def _require(method: ResourceMethod, pipeline: str, request: Request, user: BaseUser) -> None:
    """Airflow's DAG permission check on the pipeline's DAGs; 403 names what was missing."""
    if not _may(method, pipeline, request, user):
        need = "read" if method == "GET" else "edit"
        dags = ", ".join(repr(d) for d in dag_ids_of(pipeline)) or "every DAG (no DAG runs this pipeline)"
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"forbidden: {user.get_name()} may not {need} the DAG {dags}"
        )


def _readable(ledger: Ledger, request: Request, user: BaseUser) -> list[str]:
    names = read_model.pipeline_names(ledger, _settings().pipelines)
    return [p for p in names if _may("GET", p, request, user)]


def _now() -> datetime:
    return datetime.now(UTC)


def _known(ledger: Ledger, pipeline: str) -> None:
    if pipeline not in read_model.pipeline_names(ledger, _settings().pipelines):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no pipeline {pipeline!r}")


# --------------------------------------------------------------------------------------------- API


@app.get("/api/pipelines")
def list_pipelines(request: Request, user: GetUserDep) -> list[dict[str, Any]]:
    """The pipelines the user may read, each with its DAG and its epoch in flight (if any)."""
    ledger = _ledger(_settings().ledger_url)
    now = _now()
    return [
        {"pipeline": p, "dag_id": dag_id_of(p), "in_doubt": read_model.in_doubt(ledger, p, now)}
        for p in _readable(ledger, request, user)
    ]


@app.get("/api/pipelines/{pipeline}")
def get_pipeline(
    pipeline: str, request: Request, user: GetUserDep, last: Annotated[int, Query(ge=1, le=500)] = 20
) -> dict[str, Any]:
    """Epochs, what is in doubt, lag and dead letters of one pipeline (DAG read access)."""
    _require("GET", pipeline, request, user)
    settings = _settings()
    ledger = _ledger(settings.ledger_url)
    _known(ledger, pipeline)
    return read_model.pipeline_view(
        ledger, pipeline, _now(), bootstrap=settings.kafka_bootstrap, pipelines=settings.pipelines, last=last
    )


@app.get("/api/pipelines/{pipeline}/dead-letters")
def get_dead_letters(
    pipeline: str,
    request: Request,
    user: GetUserDep,
    code: str | None = None,
    text: str | None = None,
    epoch: int | None = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = read_model.DEAD_LETTER_LIMIT,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    """Committed dead letters, filtered by reason code, epoch and a text, a page of ``limit`` from
    ``offset`` (DAG read access)."""
    _require("GET", pipeline, request, user)
    ledger = _ledger(_settings().ledger_url)
    _known(ledger, pipeline)
    return read_model.dead_letter_view(
        ledger, pipeline, epoch=epoch, code=code, text=text, limit=limit, offset=offset
    )


@app.get("/api/runs/{dag_id}/{run_id}")
def get_run_epoch(dag_id: str, run_id: str, request: Request, user: GetUserDep) -> dict[str, Any]:
    """The epoch a DAG run planned (DAG read access); 404 when it planned none."""
    pipeline = pipeline_of(dag_id)
    if pipeline is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"DAG {dag_id!r} is not an onceflow pipeline's DAG")
    _require("GET", pipeline, request, user)
    found = read_model.epoch_of_run(_ledger(_settings().ledger_url), pipeline, run_id, _now())
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"run {run_id} planned no epoch of {pipeline!r}")
    return found


@app.post("/api/pipelines/{pipeline}/actions/{action}")
def act(
    pipeline: str,
    action: str,
    request: Request,
    user: GetUserDep,
    epoch: Annotated[int | None, Body(embed=True)] = None,
    force: Annotated[bool, Body(embed=True)] = False,
) -> JSONResponse:
    """commit / abort / recover through the coordinator (DAG edit access). 200 done, 409 refused by
    the invariants (nothing changed), 422 a bad request or an error (e.g. a sink still down).

    JSON bodies only: a form on another site cannot post one without the browser asking first, and
    Airflow's session cookie (SameSite=Lax) is not sent with it anyway."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "send the action as application/json")
    _require("PUT", pipeline, request, user)
    settings = _settings()
    try:
        result = actions.run_action(
            _ledger(settings.ledger_url),
            settings,
            pipeline,
            action,
            epoch=epoch,
            force=force,
            by=f"the epochs console by {user.get_name()}",
        )
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, redact.text(exc)) from None
    code = {"done": 200, "refused": 409, "error": 422}[result.outcome]
    return JSONResponse(result.to_dict(), status_code=code)


# ------------------------------------------------------------------------------------------- pages


async def _page_user(request: Request) -> BaseUser | None:
    """The signed-in user of a page request (Airflow's cookie), or None: a page sends the browser to the
    login page rather than answering 401."""
    try:
        return await get_user(request, None, None)
    except HTTPException:
        return None


PageUserDep = Annotated[BaseUser | None, Depends(_page_user)]


def _to_login(request: Request) -> Response:
    target = str(request.url.path) + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(get_auth_manager().get_url_login(next_url=target), status.HTTP_303_SEE_OTHER)


@app.get("/", response_class=HTMLResponse)
def console_page(
    request: Request,
    user: PageUserDep,
    pipeline: str | None = None,
    code: str | None = None,
    text: str | None = None,
    epoch: str | None = None,
) -> Response:
    """The console: one pipeline at a time (the first with an epoch in flight, else the first)."""
    if user is None:
        return _to_login(request)
    return HTMLResponse(
        _render_console(request, user, pipeline, {"code": code, "text": text, "epoch": epoch})
    )


def _render_console(request: Request, user: BaseUser, pipeline: str | None, raw: dict[str, Any]) -> str:
    filters = {k: str(v) for k, v in raw.items() if v}
    settings = _settings()
    ledger = _ledger(settings.ledger_url)
    readable = _readable(ledger, request, user)
    args: dict[str, Any] = {"base": URL_PREFIX, "user": user.get_name(), "filters": filters}
    if pipeline is not None and pipeline not in readable:
        why = (
            "is not known"
            if pipeline not in read_model.pipeline_names(ledger, settings.pipelines)
            else "is not readable by you"
        )
        return page.render_console(
            None, readable, can_act=False, dag_id="", problem=f"pipeline {pipeline!r} {why}", **args
        )
    now = _now()
    if pipeline is None:
        busy = [p for p in readable if read_model.in_doubt(ledger, p, now) is not None]
        pipeline = (busy or readable or [None])[0]
    if pipeline is None:
        return page.render_console(None, readable, can_act=False, dag_id="", **args)
    try:
        epoch = int(filters["epoch"]) if filters.get("epoch") else None
        letters = {"epoch": epoch, "code": filters.get("code"), "text": filters.get("text")}
        view = read_model.pipeline_view(
            ledger,
            pipeline,
            now,
            bootstrap=settings.kafka_bootstrap,
            pipelines=settings.pipelines,
            dead_letter_filters=letters,
        )
    except (ValueError, OnceflowError) as exc:
        problem = redact.text(one_line(exc))
        return page.render_console(None, readable, can_act=False, dag_id="", problem=problem, **args)
    can_act = _may("PUT", pipeline, request, user)
    return page.render_console(view, readable, can_act=can_act, dag_id=dag_id_of(pipeline), **args)


@app.get("/run", response_class=HTMLResponse)
def run_page(request: Request, user: PageUserDep, dag_id: str, run_id: str) -> Response:
    """A DAG run's epoch, shown in the "Epoch" tab of Airflow's DAG-run page."""
    if user is None:
        return _to_login(request)
    pipeline = pipeline_of(dag_id)
    found = None
    if pipeline is not None:
        _require("GET", pipeline, request, user)
        found = read_model.epoch_of_run(_ledger(_settings().ledger_url), pipeline, run_id, _now())
    return HTMLResponse(
        page.render_run(found, base=URL_PREFIX, pipeline=pipeline, dag_id=dag_id, run_id=run_id)
    )


class OnceflowConsolePlugin(AirflowPlugin):
    """Registers the console's app and its two places in Airflow's UI."""

    name = "onceflow_console"
    fastapi_apps: ClassVar[list[Any]] = [
        {"app": app, "url_prefix": URL_PREFIX, "name": "onceflow epochs console"}
    ]
    external_views: ClassVar[list[Any]] = [
        {
            "name": "Epochs",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "url_route": NAV_ROUTE,
            "nav_top_level": True,
            "icon": f"{URL_PREFIX}/static/epochs.svg",
        },
        {
            "name": "Epoch",
            "href": f"{URL_PREFIX}/run?dag_id={{DAG_ID}}&run_id={{RUN_ID}}",
            "destination": "dag_run",
            "url_route": "onceflow-epoch",
        },
    ]
