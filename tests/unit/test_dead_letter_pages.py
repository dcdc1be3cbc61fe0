"""A page of dead letters from the ledger: filtered, counted and paged in the database, payloads never
read whole. `check_pages` runs here on SQLite and on PostgreSQL in tests/integration."""

from __future__ import annotations

from pathlib import Path

from onceflow.console.read_model import dead_letter_view
from onceflow.ledger import DeadLetter, Ledger
from onceflow.ledger.dead_letter_pages import PREFIX_BYTES
from onceflow.monitoring.dead_letters import PREVIEW_CHARS
from onceflow.offsets import OffsetRange
from onceflow.testing import coordinator_for_tests

P = "pages"
BIG = 2_000_000


def fill(ledger: Ledger) -> None:
    """Epoch 1 committed with 25 letters of three codes; epoch 2 committed with 2; epoch 3 planned (its
    letters are not listed); another pipeline's letter."""
    letters = [
        DeadLetter("in", i % 2, i, None, b"{bad %d" % i, f"malformed_json: record {i}") for i in range(20)
    ]
    letters += [
        DeadLetter("in", 0, 100 + i, b"k", b"\xff\xfe", "not_utf8: invalid start byte") for i in range(4)
    ]
    letters.append(DeadLetter("in", 1, 200, None, ("€" * (BIG // 3)).encode(), "too_large"))
    second = [
        DeadLetter("in", 0, 300, None, b"50%_off", "malformed_json: 50%_off"),
        DeadLetter("in", 1, 301, None, b"x", "schema: id is not an int"),
    ]
    for number, batch in ((1, letters), (2, second), (3, second)):
        epoch = ledger.plan_epoch(P, [OffsetRange("in", 0, number - 1, number)], [])
        ledger.precommit_slice(P, number, epoch.attempt_token, [], batch)
        if number < 3:
            coordinator_for_tests(ledger, P, {}).commit(number=epoch.number)
    other = ledger.plan_epoch("other", [OffsetRange("in", 0, 0, 1)], [])
    ledger.precommit_slice("other", 1, other.attempt_token, [], letters[:1])
    coordinator_for_tests(ledger, "other", {}).commit(number=1)


def check_pages(ledger: Ledger) -> None:
    fill(ledger)
    every = ledger.dead_letter_page(P, limit=10)
    assert every.total == 27
    assert every.codes == ["malformed_json", "not_utf8", "schema", "too_large"]
    assert [(d.epoch, d.offset) for d in every.letters[:3]] == [(2, 300), (2, 301), (1, 0)]  # newest first
    pages = [ledger.dead_letter_page(P, limit=10, offset=start).letters for start in (0, 10, 20, 30)]
    listed = [(d.epoch, d.offset) for page in pages for d in page]
    assert [len(page) for page in pages] == [10, 10, 7, 0] and len(set(listed)) == 27

    big = ledger.dead_letter_page(P, code="too_large")
    assert (big.total, big.codes) == (1, ["too_large"])
    (letter,) = big.letters
    assert letter.value_size == len(("€" * (BIG // 3)).encode()) and letter.value_prefix is not None
    assert len(letter.value_prefix) <= PREFIX_BYTES  # the list never reads the payload whole

    assert ledger.dead_letter_page(P, code="malformed_json").total == 21
    assert ledger.dead_letter_page(P, code="malformed").total == 0  # a code, not a prefix of one
    assert ledger.dead_letter_page(P, code="not_utf8", epoch=1, limit=3).total == 4
    assert len(ledger.dead_letter_page(P, code="not_utf8", epoch=1, limit=3).letters) == 3
    assert ledger.dead_letter_page(P, epoch=3).total == 0  # not committed
    found = ledger.dead_letter_page(P, text="50%_")  # LIKE's wildcards are searched as themselves
    assert [d.offset for d in found.letters] == [300]
    assert [d.offset for d in ledger.dead_letter_page(P, text="IN[1]@13").letters] == [13]
    assert [d.offset for d in ledger.dead_letter_page(P, text="{BAD 17").letters] == [17]  # the payload
    assert ledger.dead_letter_page(P, text="INVALID START").codes == ["not_utf8"]
    assert ledger.dead_letter_page("other").total == 1

    view = dead_letter_view(ledger, P, code="too_large")
    size = len(("€" * (BIG // 3)).encode())  # a character cut at the prefix's end is not "not UTF-8"
    assert view["shown"][0]["value_preview"] == f"{'€' * PREVIEW_CHARS + '…'!r} ({size} bytes)"
    assert "value_base64" not in view["shown"][0]


def test_dead_letter_pages_on_sqlite(tmp_path: Path) -> None:
    with Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}", check=False) as ledger:
        ledger.upgrade()
        check_pages(ledger)
