"""``onceflow dead-letters``: the records of a pipeline that could not become rows, with their reasons.

The ledger keeps every dead letter with its epoch, position and bytes; they are listed once their epoch
commits (an aborted epoch's records are read again by the epoch that replays them, which reports them
again). Text output shows a preview of each value for a person fixing the producer; ``--json`` carries
the key and value bytes as kept (base64): a letter keeps a prefix of each and the whole sizes
(`onceflow.decoding.records.DEAD_LETTER_PREFIX_BYTES`), the record itself stays in Kafka at its offset.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onceflow.ledger import Ledger
    from onceflow.ledger.records import StoredDeadLetter

PREVIEW_CHARS = 60


def add_parser(sub: Any) -> None:
    """The ``dead-letters`` verb, on the CLI's subparsers."""
    dead = sub.add_parser(
        "dead-letters", help="records that could not become rows, with their reasons (committed epochs)"
    )
    dead.add_argument("pipeline")
    dead.add_argument("--epoch", type=int, default=None, help="only this epoch's dead letters")
    dead.add_argument("--json", action="store_true", help="machine-readable output, key and value in base64")


def run(ledger: Ledger, args: argparse.Namespace, pipelines: Sequence[str]) -> int:
    letters = find(ledger, args.pipeline, pipelines, args.epoch)
    if args.json:
        print(json.dumps([as_dict(d) for d in letters], indent=2))
        return 0
    for d in letters:
        print(describe(d))
    where = f"epoch {args.epoch} of " if args.epoch is not None else ""
    count = f"{len(letters)} dead letter{'' if len(letters) == 1 else 's'}"
    scope = "" if letters or args.epoch is not None else " (dead letters are listed once their epoch commits)"
    print(f"{count} in {where}pipeline {args.pipeline!r}{scope}")
    return 0


def find(
    ledger: Ledger, pipeline: str, pipelines: Sequence[str], epoch: int | None = None
) -> list[StoredDeadLetter]:
    """The committed dead letters of ``pipeline`` (of one epoch if given), in epoch and offset order.

    An unknown pipeline is an error that lists the known ones; an epoch that has not committed says why
    it has nothing to list (on stderr, so that ``--json`` output stays parseable)."""
    from onceflow.catalog import known_pipeline
    from onceflow.ledger import EpochStatus

    known_pipeline(ledger, pipeline, pipelines)
    if epoch is not None:
        status = ledger.epoch(pipeline, epoch).status  # an unknown epoch is a LedgerError naming it
        if status != EpochStatus.COMMITTED:
            later = (
                "its records are read again by the epoch that replays its ranges"
                if status in (EpochStatus.ABORTED, EpochStatus.ABORTING)
                else "its dead letters are listed once it commits"
            )
            print(f"epoch {epoch} of pipeline {pipeline!r} is {status}: {later}", file=sys.stderr)
            return []
    return ledger.dead_letters(pipeline, epoch=epoch)


def preview(data: bytes | None, limit: int = PREVIEW_CHARS, *, size: int | None = None) -> str:
    """A short, printable view of a key or value: its text if it is UTF-8, else its first bytes in hex.

    ``data`` may be only the start of a longer value of ``size`` bytes (what a list reads): a character
    cut at its end does not make it "not UTF-8"."""
    if data is None:
        return "(none)"
    whole = len(data) if size is None else size
    size_text = f"{whole} bytes"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        cut = whole > len(data) and exc.reason == "unexpected end of data"
        if not cut:
            shown = data[: limit // 2].hex(" ")
            more = "…" if whole > limit // 2 else ""
            return f"0x{shown}{more} ({size_text}, not UTF-8)"
        text = data[: exc.start].decode("utf-8")
    shown = text if len(text) <= limit and whole == len(data) else text[:limit] + "…"
    return f"{shown!r} ({size_text})"


def describe(stored: StoredDeadLetter) -> str:
    """One line: epoch, position, reason, then the key (if any) and value previews."""
    d = stored.letter
    key = "" if d.key is None else f"  key {preview(d.key)}"
    where = f"{d.topic}[{d.partition}]@{d.offset}"
    kept = ""
    if d.truncated:
        held = 0 if d.value is None else len(d.value)
        kept = f" (first {held} of {d.value_size} bytes kept; the record is in Kafka at its offset)"
    return f"epoch {stored.epoch}  {where}  {d.reason}{key}  value {preview(d.value)}{kept}"


def as_dict(stored: StoredDeadLetter) -> dict[str, Any]:
    d = stored.letter
    return {
        "epoch": stored.epoch,
        "topic": d.topic,
        "partition": d.partition,
        "offset": d.offset,
        "code": d.code,
        "reason": d.reason,
        "key_base64": None if d.key is None else base64.b64encode(d.key).decode(),
        "value_base64": None if d.value is None else base64.b64encode(d.value).decode(),
        "value_preview": preview(d.value),
        "key_size": d.key_size,
        "value_size": d.value_size,
        "created_at": stored.created_at.isoformat(timespec="seconds"),
    }
