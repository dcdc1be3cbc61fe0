"""A reproducible orders data set with every kind of bad record, and what the pipeline must make of it."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from examples.orders.transform import EUR_RATES

CUSTOMERS = ("ada", "bob", "chen", "dana", "eve", "femi", "gus", "hana")
# Records the decoder must dead-letter, with the reason code it gives.
UNDECODABLE: tuple[tuple[bytes, str], ...] = (
    (b"{not json", "malformed_json"),
    (b"\xff\xfe\x00", "not_utf8"),
    (b'["an", "array"]', "not_object"),
    (b'{"order_id": 1, "customer": "x"}', "missing_field"),
    (
        b'{"order_id": 7, "customer": "x", "amount": 1.0, "currency": "EUR", '
        b'"placed_at": "2026-11-27T10:00:00Z", '
        b'"items": [{"sku": "a", "qty": "one", "price": 2.5}]}',
        "wrong_type",
    ),
)


@dataclass
class OrdersData:
    """Values to produce (key, value) and the outcome each one must have."""

    records: list[tuple[bytes | None, bytes]] = field(default_factory=list)
    valid: list[int] = field(default_factory=list)  # order ids for `orders` and `orders-enriched`
    rejected: dict[int, str] = field(default_factory=dict)  # order id -> reason code
    undecodable: list[str] = field(default_factory=list)  # decoder reason codes


def make_orders(first_id: int, count: int, *, seed: int = 7, bad_every: int = 25) -> OrdersData:
    """``count`` orders from ``first_id``; every ``bad_every``-th record is broken in some way."""
    rng = random.Random(seed + first_id)
    data = OrdersData()
    for n in range(count):
        order_id = first_id + n
        order: dict[str, Any] = {
            "order_id": order_id,
            "customer": rng.choice(CUSTOMERS),
            "amount": round(rng.uniform(1, 900), 2),
            "currency": rng.choice(sorted(EUR_RATES)),
            "placed_at": f"2026-11-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z",
            "items": [
                {
                    "sku": f"sku-{rng.randint(1, 99)}",
                    "qty": rng.randint(1, 5),
                    "price": round(rng.uniform(1, 80), 2),
                }
                for _ in range(rng.randint(1, 6))
            ],
        }
        kind = (n // bad_every) % 4 if n % bad_every == bad_every - 1 else None
        if kind == 0:
            value, reason = UNDECODABLE[(n // bad_every) % len(UNDECODABLE)]
            data.records.append((b"bad", value))
            data.undecodable.append(reason)
            continue
        if kind == 1:
            order["amount"] = -abs(order["amount"])
            data.rejected[order_id] = "non_positive_amount"
        elif kind == 2:
            order["currency"] = "XXX"
            data.rejected[order_id] = "unknown_currency"
        elif kind == 3:
            order["items"] = []
            data.rejected[order_id] = "items_out_of_range"
        else:
            data.valid.append(order_id)
        data.records.append((str(order["customer"]).encode(), json.dumps(order).encode()))
    return data


def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes]],
    *,
    timestamp_ms: int | None = None,
    transactional: bool = True,
) -> None:
    """Write the records, in one Kafka transaction unless ``transactional`` is False.

    Back-dated records (``timestamp_ms`` in the past, e.g. to fill past data intervals) must be written
    without a transaction: its commit marker gets the broker's current time, so offsets_for_times of any
    earlier instant would find the marker and end every later interval there.
    """
    import uuid

    from confluent_kafka import Producer

    config = {"bootstrap.servers": bootstrap, "enable.idempotence": True}
    if transactional:
        config["transactional.id"] = f"orders-{uuid.uuid4().hex}"
    producer = Producer(config)
    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    for key, value in records:
        if timestamp_ms is None:
            producer.produce(topic, key=key, value=value)
        else:
            producer.produce(topic, key=key, value=value, timestamp=timestamp_ms)
        producer.poll(0)
    if transactional:
        producer.commit_transaction(60)
    elif producer.flush(60):
        raise RuntimeError(f"records to {topic} were not all delivered")
