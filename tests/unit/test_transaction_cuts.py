"""The cut between source transactions, on topics held in memory: records laid out as Debezium's
PostgreSQL connector writes them with transaction metadata (ids ``<xid>:<LSN>``, the LSN changing from
event to event of one transaction). The real connector's events go through the same code in
tests/integration/engine/test_cdc_transactions.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from onceflow.decoding.debezium_transactions import json_document
from onceflow.decoding.records import KafkaRecord
from onceflow.offsets import OffsetRange
from onceflow.protocol.transaction_cuts import cut_at_transactions
from onceflow.sources.errors import PlanningError
from onceflow.sources.kafka_planning import EpochPlan

TXN = "db.transaction"
A, B = "db.public.a", "db.public.b"


class Topics:
    def __init__(self) -> None:
        self.records: dict[str, list[bytes | None]] = {TXN: [], A: [], B: []}
        self.lsn = 1000

    def _id(self, xid: int) -> str:
        self.lsn += 8
        return f"{xid}:{self.lsn}"

    def transaction(self, xid: int, changes: list[str], *, end: bool = True) -> None:
        """A transaction's BEGIN, its changes (topics, in order) and, with ``end``, its END."""
        self.records[TXN].append(json.dumps({"status": "BEGIN", "id": self._id(xid)}).encode())
        per_table: dict[str, int] = {}
        for total, topic in enumerate(changes, 1):
            per_table[topic] = per_table.get(topic, 0) + 1
            self.change(topic, xid, per_table[topic], total)
        if end:
            self.end(xid, per_table)

    def change(self, topic: str, xid: int, order: int, total: int = 1) -> None:
        table = topic.rsplit(".", 1)[1]
        event = {
            "op": "c",
            "after": {"id": len(self.records[topic])},
            "source": {"schema": "public", "table": table},
            "transaction": {"id": self._id(xid), "total_order": total, "data_collection_order": order},
        }
        self.records[topic].append(json.dumps(event).encode())

    def end(self, xid: int, per_table: dict[str, int]) -> None:
        collections = [
            {"data_collection": t.split(".", 1)[1], "event_count": n} for t, n in per_table.items()
        ]
        self.records[TXN].append(
            json.dumps(
                {
                    "status": "END",
                    "id": self._id(xid),
                    "event_count": sum(per_table.values()),
                    "data_collections": collections,
                }
            ).encode()
        )

    def read(self, r: OffsetRange) -> Iterator[KafkaRecord]:
        for offset in range(r.from_offset, min(r.until_offset, len(self.records[r.topic]))):
            yield KafkaRecord(r.topic, 0, offset, None, None, self.records[r.topic][offset])

    def cut(self, start: dict[str, int] | None = None, limit: int = 100) -> dict[str, tuple[int, int]]:
        start = start or {}
        plan = EpochPlan(
            tuple(OffsetRange(t, 0, start.get(t, 0), len(rs)) for t, rs in sorted(self.records.items()))
        )
        self.last = cut_at_transactions(
            plan,
            transaction_topic=TXN,
            transaction_until=len(self.records[TXN]),
            read=self.read,
            document=json_document,
            limit=limit,
        )
        return {r.topic: (r.from_offset, r.until_offset) for r in self.last.plan.ranges}


def test_an_epoch_ends_before_a_transaction_whose_end_has_not_come() -> None:
    topics = Topics()
    topics.transaction(7, [A, B, A])
    topics.transaction(8, [B, A], end=False)
    assert topics.cut() == {TXN: (0, 2), A: (0, 2), B: (0, 1)}
    assert topics.last.whole == 1 and topics.last.held == ("8",)
    topics.end(8, {B: 1, A: 1})
    assert topics.cut({TXN: 2, A: 2, B: 1}) == {TXN: (2, 4), A: (2, 3), B: (1, 2)}


def test_a_transaction_waits_for_its_changes_still_missing_in_another_topic() -> None:
    topics = Topics()
    topics.transaction(7, [A, A])
    topics.records[TXN].append(json.dumps({"status": "BEGIN", "id": "9:1"}).encode())
    topics.change(A, 9, 1, 1)
    topics.end(9, {A: 1, B: 1})  # B's change of transaction 9 is not in Kafka yet
    assert topics.cut() == {TXN: (0, 2), A: (0, 2), B: (0, 0)}
    topics.change(B, 9, 1, 2)
    assert topics.cut({TXN: 2, A: 2}) == {TXN: (2, 4), A: (2, 3), B: (0, 1)}


def test_a_transaction_larger_than_the_limit_is_read_whole() -> None:
    topics = Topics()
    topics.transaction(7, [A] * 5)
    topics.transaction(8, [A])
    # read on in steps of the limit until a transaction is whole (here the next one came with the step)
    assert topics.cut(limit=2) == {TXN: (0, 4), A: (0, 6), B: (0, 0)}


def test_a_transaction_whose_missing_changes_can_never_come_is_taken_as_it_is() -> None:
    topics = Topics()
    topics.records[TXN].append(json.dumps({"status": "BEGIN", "id": "7:1"}).encode())
    topics.change(A, 7, 2)  # a connector that restarted re-sent only the tail of transaction 7
    topics.end(7, {A: 2})
    topics.transaction(8, [A])
    assert topics.cut() == {TXN: (0, 4), A: (0, 2), B: (0, 0)}
    assert any("7" in line and "taken as it is" in line for line in topics.last.lines)


def test_changes_outside_transactions_never_hold_an_epoch_back() -> None:
    topics = Topics()
    topics.records[A] += [json.dumps({"op": "r", "after": {"id": 1}}).encode(), None, b"not json"]
    assert topics.cut() == {TXN: (0, 0), A: (0, 3), B: (0, 0)}


def test_a_transaction_topic_of_two_partitions_is_refused() -> None:
    plan = EpochPlan((OffsetRange(TXN, 0, 0, 0), OffsetRange(TXN, 1, 0, 0), OffsetRange(A, 0, 0, 0)))
    with pytest.raises(PlanningError, match="Debezium writes one"):
        cut_at_transactions(
            plan,
            transaction_topic=TXN,
            transaction_until=0,
            read=lambda r: iter(()),
            document=json_document,
            limit=1,
        )


def test_before_the_transaction_topic_exists_changes_in_transactions_wait() -> None:
    topics = Topics()
    topics.records[A].append(json.dumps({"op": "r", "after": {"id": 0}}).encode())
    topics.transaction(7, [A])
    plan = EpochPlan((OffsetRange(A, 0, 0, 2), OffsetRange(B, 0, 0, 0)))
    cut = cut_at_transactions(
        plan, transaction_topic=TXN, transaction_until=None, read=topics.read, document=json_document, limit=9
    )
    assert {r.topic: (r.from_offset, r.until_offset) for r in cut.plan.ranges} == {A: (0, 1), B: (0, 0)}
