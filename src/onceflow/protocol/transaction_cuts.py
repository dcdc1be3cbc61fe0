"""Epochs that end between source transactions, never inside one.

A change stream whose sinks apply an epoch atomically (`postgres_changes`, `iceberg_changes`) shows a
mirror's reader each epoch whole. With Debezium's transaction metadata
(`onceflow.pipeline.Debezium.transactions`), the plan also cuts each epoch at a source transaction's
boundary, so that the reader never sees half of a source transaction, even one that wrote to several
tables of the pipeline.

How the cut is found. The transaction topic is one of the epoch's ranges (the ledger keeps its position
like any other; no task reads it). From its position on, its ``BEGIN`` events give the transactions in
the source's commit order and its ``END`` events how many changes each wrote to each table. The plan
reads the change topics' new records (only their transaction blocks matter) and counts, per transaction
and table, the changes that are in Kafka. The epoch then holds the longest run of begun transactions, in
commit order, whose ``END`` has arrived and whose changes to the pipeline's tables are all there; each
change topic's range ends at its first change of a transaction left out, and the transaction topic's
range right after the last ``END`` taken. Changes outside any transaction (the initial snapshot's rows,
tombstones) never hold an epoch back.

Two things keep the cut from waiting forever:

* a transaction larger than ``max_records_per_partition``: when nothing would be taken, the read goes on
  until the first begun transaction is whole;
* a transaction some of whose changes will never come (a connector that restarted in the middle of one
  re-sends only its tail): once every partition of a table with changes missing holds a change of a
  later transaction after it, the missing ones cannot follow (Debezium writes a transaction's changes
  of a table one after the other), and the transaction is taken as it is, said in the plan's log.

The cost: the plan reads each epoch's new change records once (their values are parsed, nothing is kept
but the transaction places), in the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from onceflow.decoding.debezium_transactions import (
    ChangePlace,
    Document,
    TransactionEnd,
    TransactionMetadataError,
    boundary,
    change_place,
)
from onceflow.decoding.records import KafkaRecord
from onceflow.offsets import OffsetRange
from onceflow.sources.errors import PlanningError
from onceflow.sources.kafka_planning import EpochPlan

Reader = Callable[[OffsetRange], Iterable[KafkaRecord]]


@dataclass(frozen=True)
class TransactionCut:
    """The epoch's ranges cut at a transaction boundary, and what the plan's log says about it."""

    plan: EpochPlan
    whole: int  # begun transactions the epoch holds whole
    held: tuple[str, ...]  # begun transactions left for a later epoch (their xids, commit order)
    lines: tuple[str, ...] = ()


@dataclass
class _Partition:
    """What the plan read of one change topic partition: each record's offset and transaction."""

    range: OffsetRange
    read_until: int
    places: list[tuple[int, str | None]] = field(default_factory=list)


@dataclass
class _Transactions:
    """The transaction topic from the position on: begun transactions in order, and their ENDs."""

    begun: list[str] = field(default_factory=list)
    ends: dict[str, tuple[TransactionEnd, int]] = field(default_factory=dict)
    skipped: int = 0


def cut_at_transactions(
    plan: EpochPlan,
    *,
    transaction_topic: str,
    transaction_until: int | None,
    read: Reader,
    document: Document,
    limit: int,
) -> TransactionCut:
    """Cut ``plan`` (ranges up to Kafka's stable offsets, no per-partition limit applied yet) at the last
    whole source transaction. ``transaction_until`` is the transaction topic's stable offset read after
    the change topics' (so every change the plan sees has its ``BEGIN`` in what is read), None while
    the topic does not exist (then no change of a transaction is taken yet); ``limit`` is the
    pipeline's ``max_records_per_partition``."""
    own = [r for r in plan.ranges if r.topic == transaction_topic]
    txn_range: OffsetRange | None = None
    txns = _Transactions()
    if transaction_until is not None:
        if len(own) != 1:
            raise PlanningError(
                f"transaction topic {transaction_topic!r} has {len(own)} partitions; Debezium writes one"
            )
        txn_range = own[0]
        window = OffsetRange(txn_range.topic, txn_range.partition, txn_range.from_offset, transaction_until)
        txns = _read_transactions(read(window), document)
    parts = [
        _Partition(r, min(r.until_offset, r.from_offset + limit))
        for r in plan.ranges
        if r.topic != transaction_topic
    ]
    seen: dict[tuple[str, str], set[int]] = {}
    for part in parts:
        _scan(part, part.range.from_offset, part.read_until, read, document, seen)
    ours = _Collections([p.range.topic for p in parts])
    while True:
        whole, released = _whole_run(txns, seen, parts, ours)
        grown = (
            not whole
            and txns.begun
            and txns.begun[0] in txns.ends
            and _read_further(parts, limit, read, document, seen)
        )
        if not grown:
            break
    held = tuple(x for x in txns.begun if x not in set(whole))
    held_set = set(held)
    ranges = []
    backlog = 0
    for part in parts:
        cut = next(
            (o for o, xid in part.places if xid in held_set or (txn_range is None and xid is not None)),
            part.read_until,
        )
        ranges.append(OffsetRange(part.range.topic, part.range.partition, part.range.from_offset, cut))
        backlog += part.range.until_offset - cut
    if txn_range is not None:
        txn_cut = txns.ends[whole[-1]][1] + 1 if whole else txn_range.from_offset
        ranges.append(OffsetRange(txn_range.topic, txn_range.partition, txn_range.from_offset, txn_cut))
        lines = [
            f"source transactions: {len(whole)} whole in this epoch"
            + (f", {len(held)} begun and left for a later one (first: {held[0]})" if held else "")
        ]
    else:
        lines = [
            f"transaction topic {transaction_topic} does not exist yet: changes in transactions wait for it"
        ]
    lines += [
        f"source transaction {xid}: {detail}; the missing changes cannot follow any more: taken as it is"
        for xid, detail in released
    ]
    if txns.skipped:
        lines.append(f"{txns.skipped} records of {transaction_topic} are no BEGIN or END event: passed over")
    return TransactionCut(
        EpochPlan(ranges=tuple(sorted(ranges)), skipped=plan.skipped, backlog=backlog),
        len(whole),
        held,
        tuple(lines),
    )


def _read_transactions(records: Iterable[KafkaRecord], document: Document) -> _Transactions:
    txns = _Transactions()
    begun: set[str] = set()
    for record in records:
        try:
            status, xid, end = (
                boundary(document(record.value)) if record.value is not None else ("", "", None)
            )
        except TransactionMetadataError:
            status = ""
        if status == "BEGIN" and xid not in begun:
            begun.add(xid)
            txns.begun.append(xid)
        elif status == "END" and end is not None and xid not in txns.ends:
            txns.ends[xid] = (end, record.offset)
        elif not status:
            txns.skipped += 1
    return txns


def _place(record: KafkaRecord, document: Document) -> ChangePlace | None:
    if record.value is None:
        return None
    try:
        return change_place(document(record.value))
    except (TransactionMetadataError, ValueError):  # bad input: the read task dead-letters it
        return None


def _scan(
    part: _Partition,
    start: int,
    stop: int,
    read: Reader,
    document: Document,
    seen: dict[tuple[str, str], set[int]],
) -> None:
    if stop <= start:
        return
    for record in read(OffsetRange(part.range.topic, part.range.partition, start, stop)):
        place = _place(record, document)
        part.places.append((record.offset, place.xid if place else None))
        if place is not None:
            seen.setdefault((place.xid, place.collection), set()).add(place.order)
    part.read_until = stop


def _read_further(
    parts: Sequence[_Partition],
    limit: int,
    read: Reader,
    document: Document,
    seen: dict[tuple[str, str], set[int]],
) -> bool:
    """Read on where the limit stopped the read; False when every partition was read to its end."""
    grown = False
    for part in parts:
        if part.read_until < part.range.until_offset:
            _scan(
                part,
                part.read_until,
                min(part.range.until_offset, part.read_until + limit),
                read,
                document,
                seen,
            )
            grown = True
    return grown


class _Collections:
    """Which tables (``schema.table``) the pipeline's change topics carry: Debezium names a table's
    topic ``<prefix>.<schema>.<table>``."""

    def __init__(self, topics: Sequence[str]) -> None:
        self.topics = sorted(set(topics))

    def topics_of(self, collection: str) -> list[str]:
        return [t for t in self.topics if t == collection or t.endswith("." + collection)]


def _whole_run(
    txns: _Transactions,
    seen: dict[tuple[str, str], set[int]],
    parts: Sequence[_Partition],
    ours: _Collections,
) -> tuple[list[str], list[tuple[str, str]]]:
    """The longest run of begun transactions, in commit order, that are whole; and those of them taken
    with changes missing that can no longer come."""
    whole: list[str] = []
    released: list[tuple[str, str]] = []
    for index, xid in enumerate(txns.begun):
        entry = txns.ends.get(xid)
        if entry is None:
            break
        end, _ = entry
        short = {
            c: (len(seen.get((xid, c), ())), n)
            for c, n in end.counts.items()
            if ours.topics_of(c) and len(seen.get((xid, c), ())) < n
        }
        if short:
            later = set(txns.begun[index + 1 :])
            if not all(_superseded(xid, later, parts, ours.topics_of(c)) for c in short):
                break
            released.append(
                (xid, ", ".join(f"{c} has {k} of its {n} changes" for c, (k, n) in short.items()))
            )
        whole.append(xid)
    return whole, released


def _superseded(xid: str, later: set[str], parts: Sequence[_Partition], topics: Sequence[str]) -> bool:
    """Whether each partition of ``topics`` holds a change of a later transaction after xid's last."""
    for part in (p for p in parts if p.range.topic in topics):
        last = max((i for i, (_, x) in enumerate(part.places) if x == xid), default=-1)
        if not any(x in later for _, x in part.places[last + 1 :]):
            return False
    return True
