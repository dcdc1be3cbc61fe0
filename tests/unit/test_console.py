"""The epochs console's library: its read model over an SQLite ledger, and its guarded actions, which
must refuse what the invariants forbid in exactly the CLI's words."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from onceflow.cli.main import main
from onceflow.committables import Committable
from onceflow.config import Settings
from onceflow.console.actions import run_action
from onceflow.console.read_model import dead_letter_view, epochs_view, in_doubt, lag_view, pipeline_view
from onceflow.ledger import DeadLetter, EpochStatus, Ledger
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.testing import RecordingCommitter, coordinator_for_tests

P = "clicks"
# The recording sink keeps its state in a JSON file in this folder: the CLI (same process) finds the
# spec through ONCEFLOW_PIPELINES and commits to the same file as the console's actions.
SINK_DIR = Path(tempfile.mkdtemp(prefix="onceflow-console-test-"))
CLICKS = Pipeline(
    P,
    KafkaSource(("in",)),
    JsonFormat({"n": "int"}),
    (SinkSpec("db", "onceflow.testing:RECORDING_KIND", {"dir": str(SINK_DIR)}),),
)
LETTERS = [
    DeadLetter("in", 0, 1, b"k", b"{not json", "malformed_json: Expecting property name"),
    DeadLetter("in", 1, 4, None, b"\xff\xfe", "not_utf8: value: invalid start byte at byte 0"),
]
# Nothing listens here: Kafka out of reach.
NO_KAFKA = "127.0.0.1:9"
# What ONCEFLOW_PIPELINES lists for the console and the CLI.
PIPELINES = (f"{__name__}:CLICKS",)


def sink() -> RecordingCommitter:
    return RecordingCommitter(path=SINK_DIR / "db.json").refresh()


def precommit(ledger: Ledger, epoch: int, token: str, task: str) -> Committable:
    c = Committable(P, epoch, 0, task, "a0", "db", handle={"path": f"/stage/{epoch}/{task}"}, record_count=3)
    sink().stage(c)
    ledger.precommit_slice(P, epoch, token, [c])
    return c


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """Epoch 1 committed (two participants, two dead letters); epoch 2 planned, one of its two
    participants pre-committed."""
    for old in SINK_DIR.glob("*.json"):
        old.unlink()
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("ONCEFLOW_LEDGER_URL", url)
    monkeypatch.setenv("ONCEFLOW_PIPELINES", f"{__name__}:CLICKS")
    with Ledger.connect(url, check=False) as ledger:
        ledger.upgrade()
        expected = [("db", "s0-t0"), ("db", "s0-t1")]
        first = ledger.plan_epoch(
            P, [OffsetRange("in", 0, 0, 3), OffsetRange("in", 1, 0, 5)], expected, run_id="manual__1"
        )
        for task, _ in enumerate(expected):
            precommit(ledger, 1, first.attempt_token, f"s0-t{task}")
        ledger.precommit_slice(P, 1, first.attempt_token, [], LETTERS)
        coordinator_for_tests(ledger, P, {"db": sink()}).commit(number=1)
        second = ledger.plan_epoch(
            P, [OffsetRange("in", 0, 3, 7), OffsetRange("in", 1, 5, 5)], expected, run_id="manual__2"
        )
        precommit(ledger, 2, second.attempt_token, "s0-t0")
        yield ledger


def settings(tmp_path: Path, ledger: Ledger) -> Settings:
    return Settings(
        tmp_path, NO_KAFKA, "postgresql://nobody@127.0.0.1:1/none", ledger.url, pipelines=PIPELINES
    )


def test_epochs_newest_first_with_ranges_participants_and_the_age_of_the_undecided_one(
    ledger: Ledger,
) -> None:
    planned_at = ledger.epoch(P, 2).planned_at
    rows = epochs_view(ledger, P, planned_at + timedelta(seconds=90))
    assert [(r["epoch"], r["status"], r["run_id"]) for r in rows] == [
        (2, "PLANNED", "manual__2"),
        (1, "COMMITTED", "manual__1"),
    ]
    assert rows[1]["ranges"] == [
        {"topic": "in", "partition": 0, "from": 0, "until": 3},
        {"topic": "in", "partition": 1, "from": 0, "until": 5},
    ]
    assert rows[1]["records"] == 8 and rows[1]["age_s"] is None  # final: no age
    assert [(p["task"], p["status"], p["age_s"]) for p in rows[1]["participants"]] == [
        ("s0-t0", "COMMITTED", None),
        ("s0-t1", "COMMITTED", None),
    ]
    assert rows[0]["age_s"] == 90.0
    assert [(p["task"], p["status"], p["staged"]) for p in rows[0]["participants"]] == [
        ("s0-t0", "PRECOMMITTED", rows[0]["participants"][0]["staged"])
    ]
    assert rows[0]["participants"][0]["age_s"] is not None


def test_in_doubt_names_the_undecided_epoch_its_prepared_participants_and_the_missing_ones(
    ledger: Ledger,
) -> None:
    epoch = ledger.epoch(P, 2)
    doubt = in_doubt(ledger, P, epoch.planned_at + timedelta(minutes=5))
    assert doubt is not None
    assert (doubt["epoch"], doubt["status"], doubt["age_s"], doubt["decided_age_s"]) == (
        2,
        "PLANNED",
        300.0,
        None,
    )
    assert [(p["task"], p["records"]) for p in doubt["prepared"]] == [("s0-t0", 3)]
    assert doubt["missing"] == ["db/s0-t1"]
    assert doubt["next_step"].startswith("undecided")
    coordinator_for_tests(ledger, P, {"db": sink()}).abort(number=2, reason="test")
    assert in_doubt(ledger, P, epoch.planned_at) is None


def test_dead_letters_are_the_committed_ones_filtered_by_code_and_text_with_previews(ledger: Ledger) -> None:
    every = dead_letter_view(ledger, P)
    assert every["total"] == 2 and every["codes"] == ["malformed_json", "not_utf8"]
    assert [(d["offset"], d["value_preview"], d["key_preview"]) for d in every["shown"]] == [
        (1, "'{not json' (9 bytes)", "'k' (1 bytes)"),
        (4, "0xff fe (2 bytes, not UTF-8)", None),
    ]
    assert "value_base64" not in every["shown"][0]
    assert [d["offset"] for d in dead_letter_view(ledger, P, code="not_utf8")["shown"]] == [4]
    assert [d["offset"] for d in dead_letter_view(ledger, P, text="NOT JSON")["shown"]] == [1]
    assert [d["offset"] for d in dead_letter_view(ledger, P, text="in[1]@4")["shown"]] == [4]
    assert dead_letter_view(ledger, P, epoch=2)["total"] == 0  # not committed: not listed yet
    assert len(dead_letter_view(ledger, P, limit=1)["shown"]) == 1


def test_lag_without_kafka_keeps_the_committed_positions_and_says_why_lag_is_unknown(ledger: Ledger) -> None:
    lag = lag_view(ledger, P, CLICKS, NO_KAFKA, timeout=0.5)
    assert lag["kafka"].startswith("lag unknown: ")
    assert [(p["topic"], p["partition"], p["committed"], p["lag"]) for p in lag["partitions"]] == [
        ("in", 0, 3, None),
        ("in", 1, 5, None),
    ]
    assert lag["total"] is None


def test_the_page_of_an_unknown_pipeline_is_an_error_naming_the_known_ones(ledger: Ledger) -> None:
    from onceflow.errors import ConfigError

    with pytest.raises(ConfigError, match="'clicks'"):
        pipeline_view(ledger, "nope", ledger.epoch(P, 1).planned_at, bootstrap=NO_KAFKA, pipelines=PIPELINES)


def test_abort_of_the_undecided_epoch_rolls_back_its_staging_and_records_who(
    ledger: Ledger, tmp_path: Path
) -> None:
    done = run_action(ledger, settings(tmp_path, ledger), P, "abort", epoch=2, by="the epochs console by ann")
    assert (done.outcome, done.status, done.epoch) == ("done", "ABORTED", 2)
    assert ledger.epoch(P, 2).abort_reason == "aborted by hand with the epochs console by ann"
    assert sink().orphans(P) == []  # the pre-committed participant's staging was rolled back
    again = run_action(ledger, settings(tmp_path, ledger), P, "abort", epoch=2, by="x")
    assert (again.outcome, again.status) == ("done", "ABORTED")
    assert "already aborted" in again.log[0]


def test_refusals_read_exactly_as_the_cli_prints_them(
    ledger: Ledger, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = settings(tmp_path, ledger)
    refused = run_action(ledger, s, P, "abort", epoch=1, by="the epochs console by ann")
    assert refused.outcome == "refused"
    assert refused.line.startswith(
        "abort refused: cannot abort epoch 1 of pipeline 'clicks': it is COMMITTED"
    )
    assert main(["abort", P, "1"]) == 3
    assert capsys.readouterr().err.strip() == f"onceflow: {refused.line}"
    assert ledger.epoch(P, 1).status is EpochStatus.COMMITTED

    missing = run_action(ledger, s, P, "commit", epoch=2, by="x")  # one participant has not pre-committed
    assert missing.outcome == "refused" and ledger.epoch(P, 2).status is EpochStatus.PLANNED
    assert main(["commit", P, "2"]) == 3
    assert capsys.readouterr().err.strip() == f"onceflow: {missing.line}"

    run_action(ledger, s, P, "abort", epoch=2, by="x")
    aborted = run_action(ledger, s, P, "commit", epoch=2, by="x")
    assert aborted.outcome == "refused"
    assert aborted.line.startswith(
        "commit refused: cannot commit epoch 2 of pipeline 'clicks': it is ABORTED"
    )


def test_commit_of_a_committed_epoch_changes_nothing_and_recover_reports(
    ledger: Ledger, tmp_path: Path
) -> None:
    s = settings(tmp_path, ledger)
    done = run_action(ledger, s, P, "commit", epoch=1, by="x")
    assert (done.outcome, done.status) == ("done", "COMMITTED")
    assert "already committed" in done.log[0]
    recovered = run_action(ledger, s, P, "recover", by="the epochs console by ann", force=True)
    assert recovered.outcome == "done" and recovered.epoch == 2
    assert recovered.line.startswith("pipeline 'clicks': epoch 2 aborted")
    assert ledger.epoch(P, 2).abort_reason.startswith(
        "aborted by the epochs console by ann (recover --force)"
    )


def test_bad_requests_and_unknown_pipelines(ledger: Ledger, tmp_path: Path) -> None:
    s = settings(tmp_path, ledger)
    with pytest.raises(ValueError, match="unknown action 'drop'"):
        run_action(ledger, s, P, "drop", epoch=1, by="x")
    with pytest.raises(ValueError, match="abort needs an epoch number"):
        run_action(ledger, s, P, "abort", by="x")
    unknown = run_action(ledger, s, "nope", "abort", epoch=1, by="x")
    assert unknown.outcome == "error" and unknown.line.startswith("error: pipeline 'nope' is not among")
    no_epoch = run_action(ledger, s, P, "abort", epoch=9, by="x")
    assert no_epoch.outcome == "error" and "9" in no_epoch.line


def test_the_page_escapes_what_producers_wrote(ledger: Ledger) -> None:
    from onceflow.console.page import render_console

    hostile = DeadLetter("in", 0, 2, b"<b>", b"<script>alert(1)</script>", "malformed_json: <img src=x>")
    second = ledger.epoch(P, 2)
    coordinator_for_tests(ledger, P, {"db": sink()}).abort(number=2, reason="<i>why</i>")
    third = ledger.plan_epoch(P, [OffsetRange("in", 0, 3, 7), OffsetRange("in", 1, 5, 5)], [])
    ledger.precommit_slice(P, third.number, third.attempt_token, [], [hostile])
    coordinator_for_tests(ledger, P, {}).commit(number=third.number)
    view = pipeline_view(
        ledger, P, second.planned_at, bootstrap=NO_KAFKA, pipelines=PIPELINES, kafka_timeout=0.5
    )
    html = render_console(view, [P], base="/onceflow", user="<u>", can_act=True, dag_id="d", filters={})
    assert "<script>alert" not in html and "<img" not in html and "<i>why" not in html and "<u>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "malformed_json: &lt;img src=x&gt;" in html
