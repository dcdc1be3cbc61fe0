"""``onceflow dead-letters``: the records of a pipeline that could not become rows, with their reasons.

The ledger keeps every dead letter with its epoch, position and bytes; they are listed once their epoch
commits (an aborted epoch's records are read again by the epoch that replays them, which reports them
again). Text output shows a preview of each value for a person fixing the producer; ``--json`` carries
the key and value bytes as kept (base64): a letter keeps a prefix of each and the whole sizes
(`onceflow.decoding.records.DEAD_LETTER_PREFIX_BYTES`), the record itself stays in Kafka at its offset.
Both list a page (``--limit``, ``--offset``) in epoch and position order, counted in the ledger: text
reads only the start of each payload, as the console does, and JSON the payloads of the page only.
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
    from onceflow.ledger.dead_letter_pages import DeadLetterSummary
    from onceflow.ledger.records import StoredDeadLetter

PREVIEW_CHARS = 60
PAGE = 1000  # letters a page lists unless --limit says otherwise


def add_parser(sub: Any) -> None:
    """The ``dead-letters`` verb, on the CLI's subparsers."""
    dead = sub.add_parser(
        "dead-letters", help="records that could not become rows, with their reasons (committed epochs)"
    )
    dead.add_argument("pipeline")
    dead.add_argument("--epoch", type=int, default=None, help="only this epoch's dead letters")
    dead.add_argument("--json", action="store_true", help="machine-readable output, key and value in base64")
    dead.add_argument(
        "--limit", type=_at_least(1), default=PAGE, help=f"letters listed at most (default {PAGE})"
    )
    dead.add_argument("--offset", type=_at_least(0), default=0, help="letters skipped first (default 0)")


def _at_least(low: int) -> Any:
    def parse(text: str) -> int:
        value = int(text)  # a ValueError is argparse's usage error
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def run(ledger: Ledger, args: argparse.Namespace, pipelines: Sequence[str]) -> int:
    if not listable(ledger, args.pipeline, pipelines, args.epoch):
        print("[]" if args.json else f"0 dead letters in epoch {args.epoch} of pipeline {args.pipeline!r}")
        return 0
    if args.json:
        letters = ledger.dead_letters(args.pipeline, epoch=args.epoch, limit=args.limit, offset=args.offset)
        print(json.dumps([as_dict(d) for d in letters], indent=2))
        total = ledger.dead_letter_count(args.pipeline, epoch=args.epoch)
        if args.offset + len(letters) < total:
            print(f"{total} dead letters in all: {_next(args, len(letters))}", file=sys.stderr)
        return 0
    page = ledger.dead_letter_page(
        args.pipeline, epoch=args.epoch, limit=args.limit, offset=args.offset, oldest_first=True
    )
    for d in page.letters:
        print(describe_summary(d))
    where = f"epoch {args.epoch} of " if args.epoch is not None else ""
    count = f"{page.total} dead letter{'' if page.total == 1 else 's'}"
    shown = len(page.letters)
    if args.offset or shown < page.total:
        count = f"{args.offset + 1}-{args.offset + shown} of {count}" if shown else f"none of {count}"
    scope = (
        "" if page.total or args.epoch is not None else " (dead letters are listed once their epoch commits)"
    )
    more = f"; {_next(args, shown)}" if args.offset + shown < page.total else ""
    print(f"{count} in {where}pipeline {args.pipeline!r}{scope}{more}")
    return 0


def _next(args: argparse.Namespace, shown: int) -> str:
    return f"the next page: --offset {args.offset + shown} --limit {args.limit}"


def listable(ledger: Ledger, pipeline: str, pipelines: Sequence[str], epoch: int | None = None) -> bool:
    """Whether ``pipeline`` (its epoch ``epoch`` if given) has committed dead letters to list.

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
            return False
    return True


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


def describe_summary(d: DeadLetterSummary) -> str:
    """`describe`'s line from what a page reads: the start of the key and value, and their sizes."""
    key = "" if d.key_prefix is None else f"  key {preview(d.key_prefix, size=d.key_size)}"
    where = f"{d.topic}[{d.partition}]@{d.offset}"
    kept = ""
    held = d.value_kept or 0
    if d.value_size is not None and held < d.value_size:
        kept = f" (first {held} of {d.value_size} bytes kept; the record is in Kafka at its offset)"
    value = preview(d.value_prefix, size=d.value_kept)
    return f"epoch {d.epoch}  {where}  {d.reason}{key}  value {value}{kept}"


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
