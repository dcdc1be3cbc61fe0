"""A reader of Delta tables for the tests that shares nothing with the sink nor delta-rs: it replays the
log's JSON commits (add and remove actions) itself, so a fault of delta-rs cannot hide one of the sink."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def live_files(actions: Iterable[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The table's column names and its live add actions once the log's ``actions`` are applied in order."""
    live: dict[str, dict[str, Any]] = {}
    fields: list[str] = []
    for action in actions:
        if "metaData" in action:
            fields = [f["name"] for f in json.loads(action["metaData"]["schemaString"])["fields"]]
        if "add" in action:
            live[action["add"]["path"]] = action["add"]
        if "remove" in action:
            live.pop(action["remove"]["path"], None)
    return fields, list(live.values())


def local_log_actions(path: str, version: int | None = None) -> Iterator[dict[str, Any]]:
    """The actions of a table in a local folder, from its JSON commits up to ``version``, in order."""
    log = Path(path) / "_delta_log"
    assert not list(log.glob("*.checkpoint*.parquet")), "this reader replays JSON commits only"
    for commit in sorted(log.glob("*.json")):
        if version is not None and int(commit.stem) > version:
            break
        yield from (json.loads(line) for line in commit.read_text().splitlines() if line.strip())
