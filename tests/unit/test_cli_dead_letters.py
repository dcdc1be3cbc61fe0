"""``onceflow dead-letters``: what it lists (committed epochs only), its text and JSON forms, and the one
line an unknown pipeline or epoch gives; against an SQLite ledger file."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from onceflow.cli.main import EXIT_ERROR, main
from onceflow.ledger import DeadLetter, Ledger
from onceflow.monitoring.dead_letters import preview
from onceflow.offsets import OffsetRange
from onceflow.testing import coordinator_for_tests

P = "clicks"
LETTERS = [
    DeadLetter("in", 0, 1, b"eve", b"{not json", "malformed_json: Expecting property name"),
    DeadLetter("in", 1, 4, None, b"\xff\xfe", "not_utf8: value: invalid start byte at byte 0"),
]


@pytest.fixture
def ledger_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ledger where epoch 1 committed two dead letters and epoch 2 is planned with one of its own."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("ONCEFLOW_LEDGER_URL", url)
    with Ledger.connect(url, check=False) as ledger:
        ledger.upgrade()
        first = ledger.plan_epoch(P, [OffsetRange("in", 0, 0, 3), OffsetRange("in", 1, 0, 5)], [])
        ledger.precommit_slice(P, 1, first.attempt_token, [], LETTERS)
        coordinator_for_tests(ledger, P, {}).commit(number=1)
        second = ledger.plan_epoch(P, [OffsetRange("in", 0, 3, 4), OffsetRange("in", 1, 5, 5)], [])
        ledger.precommit_slice(
            P, 2, second.attempt_token, [], [DeadLetter("in", 0, 3, None, b"[]", "not_object: x")]
        )
    return url


def test_lists_committed_dead_letters_with_reason_position_and_preview(
    ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dead-letters", P]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "epoch 1  in[0]@1  malformed_json: Expecting property name  key 'eve' (3 bytes)  "
        "value '{not json' (9 bytes)",
        "epoch 1  in[1]@4  not_utf8: value: invalid start byte at byte 0  value 0xff fe (2 bytes, not UTF-8)",
        "2 dead letters in pipeline 'clicks'",
    ]


def test_json_carries_the_bytes_whole(ledger_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dead-letters", P, "--epoch", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["topic"], r["partition"], r["offset"], r["code"], r["reason"]) for r in rows] == [
        (d.topic, d.partition, d.offset, d.code, d.reason) for d in LETTERS
    ]
    assert [base64.b64decode(r["value_base64"]) for r in rows] == [d.value for d in LETTERS]
    assert [r["key_base64"] for r in rows] == [base64.b64encode(b"eve").decode(), None]


def test_an_epoch_not_committed_lists_nothing_and_says_why(
    ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dead-letters", P, "--epoch", "2", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == []
    assert captured.err.strip() == (
        "epoch 2 of pipeline 'clicks' is PLANNED: its dead letters are listed once it commits"
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["dead-letters", "clickz"],
            "onceflow: error: no pipeline 'clickz': the ledger at {url} and ONCEFLOW_PIPELINES know 'clicks'",
        ),
        (["dead-letters", P, "--epoch", "7"], "onceflow: error: pipeline 'clicks' has no epoch 7"),
    ],
)
def test_unknown_pipeline_or_epoch_is_one_line_and_exit_1(
    ledger_url: str, args: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == EXIT_ERROR
    captured = capsys.readouterr()
    assert captured.err.strip() == line.format(url=ledger_url)
    assert captured.out == ""


@pytest.mark.parametrize(
    "args",
    [["dead-letters"], ["dead-letters", P, "--epoch", "one"], ["dead-letters", P, "--limit", "three"]],
)
def test_bad_usage_exits_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    assert "usage: onceflow" in capsys.readouterr().err


def test_preview_shortens_long_values_and_names_missing_ones() -> None:
    assert preview(None) == "(none)"
    assert preview(b"x" * 100, limit=10) == "'xxxxxxxxxx…' (100 bytes)"
    assert preview(b"\xff\xfe" * 40, limit=8) == "0xff fe ff fe… (80 bytes, not UTF-8)"
    assert preview(b"a\x00b") == "'a\\x00b' (3 bytes)"  # control characters escaped
