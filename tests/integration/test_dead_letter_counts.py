"""Counting dead letters never loads a payload, and ``onceflow dead-letters`` lists a page at a time.

Every SQL statement the report step, the commit's metrics, the console's run view and the command send is
recorded (on SQLite and on PostgreSQL ledgers): none selects a letter's key or value column whole, only a
count, the positions, or the start of a value for a preview.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from onceflow.cli.main import main
from onceflow.console import read_model
from onceflow.ledger import DeadLetter, Ledger
from onceflow.monitoring.metrics import epoch_metrics
from onceflow.offsets import OffsetRange
from onceflow.protocol.epoch_report import report_lines
from onceflow.testing import coordinator_for_tests

pytestmark = pytest.mark.integration

P = "counted"
LETTERS = 1_200
# A whole payload column in a select list: not inside substr(...), length(...) or a *_size column.
WHOLE_PAYLOAD = re.compile(r"(?<![(\w])dead_letters\.(key|value)\b", re.IGNORECASE)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ledger whose epoch 1, planned by run ``r1``, committed `LETTERS` dead letters of 1 KiB each."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        url = str(request.getfixturevalue("pg_database"))
    monkeypatch.setenv("ONCEFLOW_LEDGER_URL", url)
    with Ledger.connect(url, check=False) as ledger:
        ledger.upgrade()
        epoch = ledger.plan_epoch(P, [OffsetRange("in", 0, 0, LETTERS)], [], run_id="r1")
        letters = [
            DeadLetter("in", 0, n, b"k" * 1024, b"v" * 1024, f"not_object: letter {n}")
            for n in range(LETTERS)
        ]
        ledger.precommit_slice(P, 1, epoch.attempt_token, [], letters)
        coordinator_for_tests(ledger, P, {}).commit(number=1)
    return url


@pytest.fixture
def statements() -> Iterator[list[str]]:
    """The SQL of every statement any engine of this process sends meanwhile."""
    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def payload_reads(statements: list[str]) -> list[str]:
    return [s for s in statements if s.lstrip().upper().startswith("SELECT") and WHOLE_PAYLOAD.search(s)]


def test_the_report_the_metrics_and_the_run_view_count_in_sql(ledger_url: str, statements: list[str]) -> None:
    with Ledger.connect(ledger_url, check=False) as ledger:
        statements.clear()
        assert report_lines(ledger, P, "r1")[-1] == f"  dead letters: {LETTERS}"
        epoch = ledger.epoch(P, 1)
        counted = {m.name: m.value for m in epoch_metrics(ledger, epoch)}
        assert counted[f"onceflow.{P}.dead_letters"] == LETTERS
        view = read_model.epoch_of_run(ledger, P, "r1", datetime.now(UTC))
        assert view is not None and view["dead_letters"] == LETTERS
        assert statements and payload_reads(statements) == []
        assert ledger.dead_letter_count(P) == LETTERS


def test_the_command_lists_a_page_and_says_where_the_next_one_starts(
    ledger_url: str, statements: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    statements.clear()
    assert main(["dead-letters", P, "--limit", "3", "--offset", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[1] for line in lines[:-1]] == ["in[0]@4", "in[0]@5", "in[0]@6"]
    assert lines[0].startswith("epoch 1  in[0]@4  not_object: letter 4  key 'kkkk")
    assert lines[-1] == (
        f"5-7 of {LETTERS} dead letters in pipeline {P!r}; the next page: --offset 7 --limit 3"
    )
    assert payload_reads(statements) == []
    # JSON carries the bytes, of the page only.
    assert main(["dead-letters", P, "--json", "--limit", "2"]) == 0
    captured = capsys.readouterr()
    assert [r["offset"] for r in json.loads(captured.out)] == [0, 1]
    assert "the next page: --offset 2 --limit 2" in captured.err
