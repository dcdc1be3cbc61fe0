"""The console's HTML, rendered on the server from the read model's dicts: no build step, no framework.

Two pages: a pipeline's console (epochs, what is in doubt, lag, dead letters, and the action form), and
one run's epoch (shown on Airflow's DAG-run page). Every value is escaped here; the page's script
(``console.js``, served by the plugin) only posts actions and shows their answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import urlencode

TITLE = "onceflow epochs"


def _e(value: object) -> str:
    return escape("" if value is None else str(value))


def _age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m {s % 60}s"
    return f"{s // 3600}h {s % 3600 // 60}m"


def _status(status: str) -> str:
    return f'<span class="status status-{_e(status.lower())}">{_e(status)}</span>'


def _table(cls: str, head: Sequence[str], rows: Sequence[Sequence[str]], empty: str) -> str:
    if not rows:
        return f'<p class="empty {cls}">{_e(empty)}</p>'
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _ranges(epoch: Mapping[str, Any]) -> str:
    items = [
        f'<li class="range">{_e(r["topic"])}[{r["partition"]}] [{r["from"]}, {r["until"]})</li>'
        for r in epoch["ranges"]
    ]
    return f'<ul class="ranges">{"".join(items)}</ul>' if items else "(no input)"


def _participants(epoch: Mapping[str, Any]) -> str:
    items = [
        f'<li class="participant">{_e(p["sink"])}/{_e(p["task"])} {_e(p["attempt"])} '
        f"{_status(p['status'])} {p['records']} records"
        + (f' <span class="age">prepared {_age(p["age_s"])} ago</span>' if p.get("age_s") is not None else "")
        + "</li>"
        for p in epoch["participants"]
    ]
    done = f"{len(epoch['participants'])}/{epoch['expected_participants']} pre-committed"
    return f'<span class="count">{done}</span><ul class="participants">{"".join(items)}</ul>'


def _interval(epoch: Mapping[str, Any]) -> str:
    start, end = epoch["data_interval"]
    return "" if start is None and end is None else f"{_e(start)} .. {_e(end)}"


def _times(epoch: Mapping[str, Any]) -> str:
    parts = [f"{k} {_e(epoch[k + '_at'])}" for k in ("planned", "decided", "finished") if epoch[k + "_at"]]
    return "<br>".join(parts)


def _act_buttons(epoch: Mapping[str, Any], can_act: bool) -> str:
    if epoch["status"] in ("COMMITTED", "ABORTED"):
        return ""
    disabled = "" if can_act else " disabled"
    return "".join(
        f'<button type="button" class="act act-{a}" data-action="{a}" data-epoch="{epoch["epoch"]}"'
        f"{disabled}>{a.capitalize()}</button>"
        for a in ("commit", "abort")
    )


def epochs_table(epochs: Sequence[Mapping[str, Any]], *, can_act: bool, with_actions: bool = True) -> str:
    rows = [
        [
            f'<span class="epoch-number">{e["epoch"]}</span>',
            _status(e["status"])
            + (f'<div class="reason">{_e(e["abort_reason"])}</div>' if e["abort_reason"] else ""),
            f'<code class="run-id">{_e(e["run_id"])}</code>',
            _interval(e),
            _ranges(e),
            _participants(e),
            _times(e)
            + (f'<div class="age">in flight {_age(e["age_s"])}</div>' if e.get("age_s") is not None else ""),
            *([_act_buttons(e, can_act)] if with_actions else []),
        ]
        for e in epochs
    ]
    head = ["epoch", "status", "run", "data interval", "ranges", "participants", "times"]
    return _table("epochs", head + (["act"] if with_actions else []), rows, "no epochs yet")


def _in_doubt(doubt: Mapping[str, Any] | None) -> str:
    if doubt is None:
        return '<p class="empty in-doubt">nothing in doubt: no epoch in flight</p>'
    decided = f", decided {_age(doubt['decided_age_s'])} ago" if doubt["decided_age_s"] is not None else ""
    lease = f", lease until {_e(doubt['lease_expires_at'])}" if doubt["lease_expires_at"] else ""
    prepared = _table(
        "prepared",
        ["participant", "attempt", "records", "staged", "prepared for"],
        [
            [
                f"{_e(p['sink'])}/{_e(p['task'])}",
                _e(p["attempt"]),
                str(p["records"]),
                _e(p["staged"]),
                _age(p["age_s"]),
            ]
            for p in doubt["prepared"]
        ],
        "no participant prepared",
    )
    missing = (
        f'<p class="missing">not pre-committed yet: {_e(", ".join(doubt["missing"]))}</p>'
        if doubt["missing"]
        else ""
    )
    return (
        f'<div class="in-doubt"><p>epoch <b>{doubt["epoch"]}</b> {_status(doubt["status"])} '
        f"(run <code>{_e(doubt['run_id'])}</code>, owner {_e(doubt['owner'] or 'none recorded')}{lease}) "
        f"planned {_age(doubt['age_s'])} ago{decided}</p>"
        f'<p class="next-step">{_e(doubt["next_step"])}</p>{prepared}{missing}</div>'
    )


def _lag(lag: Mapping[str, Any]) -> str:
    rows = [
        [_e(p["topic"]), str(p["partition"]), _e(p["committed"]), _e(p["end"]), _e(p["lag"])]
        for p in lag["partitions"]
    ]
    note = "" if lag["kafka"] == "ok" else f'<p class="warn">{_e(lag["kafka"])}</p>'
    total = "" if lag["total"] is None else f'<p class="total">total lag {lag["total"]}</p>'
    head = ["topic", "partition", "committed position", "last stable offset", "lag"]
    return _table("lag", head, rows, "no partition known yet") + total + note


def _dead_letters(letters: Mapping[str, Any], filters: Mapping[str, str], pipeline: str) -> str:
    options = "".join(
        f'<option value="{_e(c)}"{" selected" if filters.get("code") == c else ""}>{_e(c)}</option>'
        for c in letters["codes"]
    )
    form = (
        '<form class="filters" method="get">'
        f'<input type="hidden" name="pipeline" value="{_e(pipeline)}">'
        f'<label>reason <select name="code"><option value="">any</option>{options}</select></label> '
        f'<label>epoch <input name="epoch" size="5" value="{_e(filters.get("epoch"))}"></label> '
        f'<label>text <input name="text" value="{_e(filters.get("text"))}"></label> '
        '<button type="submit">Filter</button></form>'
    )
    rows = [
        [
            str(d["epoch"]),
            f"{_e(d['topic'])}[{d['partition']}]@{d['offset']}",
            f'<span class="reason">{_e(d["reason"])}</span>',
            _e(d["key_preview"]),
            f'<code class="payload">{_e(d["value_preview"])}</code>',
        ]
        for d in letters["shown"]
    ]
    shown = len(letters["shown"])
    count = f'<p class="count">{letters["total"]} dead letter{"" if letters["total"] == 1 else "s"}' + (
        f", the first {shown} shown</p>" if shown < letters["total"] else "</p>"
    )
    table = _table(
        "dead-letters",
        ["epoch", "position", "reason", "key", "payload"],
        rows,
        "no dead letters (they are listed once their epoch commits)",
    )
    return form + count + table


def _action_form(pipeline: str, can_act: bool, dag_id: str) -> str:
    if not can_act:
        return (
            f'<p class="read-only">You may look, not act: commit, abort and recover need permission to edit '
            f"the DAG <code>{_e(dag_id)}</code>.</p>"
        )
    return (
        f'<form id="action-form" class="action-form" data-pipeline="{_e(pipeline)}">'
        '<label>action <select name="action"><option>abort</option><option>commit</option>'
        "<option>recover</option></select></label> "
        '<label>epoch <input name="epoch" size="6" inputmode="numeric"></label> '
        '<label><input type="checkbox" name="force"> force</label> '
        '<span class="hint">(recover: also roll back an undecided epoch whose owner is alive)</span> '
        '<button type="submit">Run</button></form>'
    )


def _document(title: str, body: str, base: str, data: Mapping[str, str]) -> str:
    attrs = " ".join(f'data-{k}="{_e(v)}"' for k, v in data.items())
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title>"
        f'<link rel="stylesheet" href="{_e(base)}/static/console.css"></head>'
        f'<body {attrs}>{body}<script src="{_e(base)}/static/console.js"></script></body></html>'
    )


def render_console(
    view: Mapping[str, Any] | None,
    pipelines: Sequence[str],
    *,
    base: str,
    user: str,
    can_act: bool,
    dag_id: str,
    filters: Mapping[str, str],
    problem: str | None = None,
) -> str:
    """The console page of one pipeline (``view`` from `read_model.pipeline_view`), with links to the
    other pipelines the user may see."""
    current = view["pipeline"] if view else None
    links = " ".join(
        f'<a class="pipeline{" current" if p == current else ""}" '
        f'href="{_e(base)}/?{urlencode({"pipeline": p})}">{_e(p)}</a>'
        for p in pipelines
    )
    head = (
        f'<header><h1>{TITLE}</h1><nav class="pipelines">{links or "no pipelines yet"}</nav>'
        f'<span class="user">signed in as {_e(user)}</span></header>'
        '<div id="action-result" class="action-result" hidden></div>'
    )
    if problem:
        return _document(TITLE, head + f'<p class="warn problem">{_e(problem)}</p>', base, {"base": base})
    if view is None:
        return _document(TITLE, head + '<p class="empty">no pipeline to show</p>', base, {"base": base})
    current = str(view["pipeline"])
    body = (
        head + f'<h2>pipeline <span class="pipeline-name">{_e(current)}</span> '
        f"<small>DAG <code>{_e(dag_id)}</code></small></h2>"
        + (
            ""
            if view["spec_known"]
            else '<p class="warn">ONCEFLOW_PIPELINES does not list this pipeline: '
            "its sinks are unknown here, so it can be looked at but not acted on</p>"
        )
        + f'<section id="in-doubt"><h3>In doubt now</h3>{_in_doubt(view["in_doubt"])}</section>'
        + f'<section id="actions"><h3>Act</h3>{_action_form(current, can_act, dag_id)}</section>'
        + f'<section id="epochs"><h3>Epochs</h3>{epochs_table(view["epochs"], can_act=can_act)}</section>'
        + f'<section id="lag"><h3>Lag</h3>{_lag(view["lag"])}</section>'
        + '<section id="dead-letters"><h3>Dead letters</h3>'
        + _dead_letters(view["dead_letters"], filters, current)
        + "</section>"
        + f"<footer>as of {_e(view['now'])}</footer>"
    )
    return _document(f"{TITLE}: {current}", body, base, {"base": base, "pipeline": current})


def render_run(
    epoch: Mapping[str, Any] | None,
    *,
    base: str,
    pipeline: str | None,
    dag_id: str,
    run_id: str,
) -> str:
    """One DAG run's epoch, for the tab on Airflow's DAG-run page."""
    if pipeline is None:
        body = f'<p class="empty">DAG <code>{_e(dag_id)}</code> is not an onceflow pipeline\'s DAG.</p>'
    elif epoch is None:
        body = f'<p class="empty">run <code>{_e(run_id)}</code> planned no epoch of {_e(repr(pipeline))}.</p>'
    else:
        link = f"/plugin/onceflow-epochs{base}/?{urlencode({'pipeline': pipeline})}"
        body = (
            f"<h2>epoch {epoch['epoch']} of pipeline {_e(pipeline)} {_status(epoch['status'])}</h2>"
            + epochs_table([epoch], can_act=False, with_actions=False)
            + f'<p class="count">{epoch["dead_letters"]} dead letter(s) in this epoch</p>'
            + f'<p><a href="{_e(link)}" target="_top">open the pipeline in the epochs console</a></p>'
        )
    return _document(f"{TITLE}: {run_id}", f'<div class="run-view">{body}</div>', base, {"base": base})
