"""The benchmark data set: N JSON records of 200 bytes spread evenly over a 4-partition topic.

Every benchmark reads the same records and applies the same work (JSON decode, a filter that keeps 90 %,
a projection to three columns), so that throughputs of onceflow, its peers and the plain consumer compare.
The Avro step writes the very same records (same fields and values, the padding note included) as Avro in
the schema registry wire format, so that only the encoding differs; its values are smaller than 200 bytes.
The nested steps write orders with items and a context object, as JSON of 600 bytes or as Avro.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PARTITIONS = 4
RECORD_BYTES = 200
# The filter keeps amount >= MIN_AMOUNT: amounts are spread evenly over [0, 100), so 90 % pass.
MIN_AMOUNT = 10.0
PROJECTED = ("id", "amount", "customer")
SCHEMA = {"id": "int", "amount": "float", "customer": "string", "country": "string", "note": "string"}
# SCHEMA as an Avro record: JSON's "int" and "float" columns are 64-bit, so long and double here.
AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "BenchRecord",
    "namespace": "dev.onceflow.bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": "double"},
        {"name": "customer", "type": "string"},
        {"name": "country", "type": "string"},
        {"name": "note", "type": "string"},
    ],
}


def amount_of(i: int) -> float:
    return (i * 7919 % 10_000) / 100


def _padded(head: dict[str, Any], size: int) -> dict[str, Any]:
    """``head`` with its ``note`` set to the padding that makes its compact JSON exactly ``size`` bytes."""
    head["note"] = ""
    pad = size - len(json.dumps(head, separators=(",", ":")))
    if pad < 0:
        raise ValueError(f"record {head['id']} is longer than {size} bytes")
    head["note"] = "x" * pad
    return head


def _head(i: int) -> dict[str, Any]:
    return {"id": i, "amount": amount_of(i), "customer": f"c{i % 5000:05d}", "country": "DE", "note": ""}


def fields(i: int) -> dict[str, Any]:
    """Record ``i``'s fields, with a ``note`` padding its JSON to exactly RECORD_BYTES."""
    return _padded(_head(i), RECORD_BYTES)


# The nested data set: an order with its items and a context object, padded to NESTED_RECORD_BYTES.
NESTED_RECORD_BYTES = 600
NESTED_ITEMS = 5
NESTED_SCHEMA: dict[str, Any] = {
    "id": "int",
    "amount": "float",
    "customer": "string",
    "country": "string",
    "items": [{"sku": "string", "qty": "int", "price": "float"}],
    "ctx": {"ip": "string", "agent": "string"},
    "note": "string",
}
# NESTED_SCHEMA as an Avro record, for the nested Avro step (64-bit numbers, as in AVRO_SCHEMA).
NESTED_AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "BenchOrder",
    "namespace": "dev.onceflow.bench",
    "fields": [
        *AVRO_SCHEMA["fields"][:4],
        {
            "name": "items",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "BenchItem",
                    "fields": [
                        {"name": "sku", "type": "string"},
                        {"name": "qty", "type": "long"},
                        {"name": "price", "type": "double"},
                    ],
                },
            },
        },
        {
            "name": "ctx",
            "type": {
                "type": "record",
                "name": "BenchContext",
                "fields": [{"name": "ip", "type": "string"}, {"name": "agent", "type": "string"}],
            },
        },
        AVRO_SCHEMA["fields"][4],
    ],
}
# The nested pipeline's output: the flat projection and the items, nested as they came.
NESTED_PROJECTED = (*PROJECTED, "items")


def nested_fields(i: int) -> dict[str, Any]:
    """Nested record ``i``: record i's fields, NESTED_ITEMS items and a context, with a ``note`` padding
    its JSON to exactly NESTED_RECORD_BYTES."""
    items = [
        {
            "sku": f"sku-{(i * 31 + k) % 9973:04d}",
            "qty": 1 + (i + k) % 4,
            "price": (i * 13 + k * 7) % 5000 / 100,
        }
        for k in range(NESTED_ITEMS)
    ]
    ctx = {"ip": f"10.{i % 256}.{i // 256 % 256}.{i % 7}", "agent": "bench"}
    return _padded(_head(i) | {"items": items, "ctx": ctx}, NESTED_RECORD_BYTES)


def nested_record(i: int) -> bytes:
    """Nested record ``i`` as JSON, exactly NESTED_RECORD_BYTES long."""
    return json.dumps(nested_fields(i), separators=(",", ":")).encode()


def record(i: int) -> bytes:
    """Record ``i`` as JSON, exactly RECORD_BYTES long."""
    return json.dumps(fields(i), separators=(",", ":")).encode()


def avro_record(
    schema_id: int,
    schema: dict[str, Any] = AVRO_SCHEMA,
    values: Callable[[int], dict[str, Any]] = fields,
) -> Callable[[int], bytes]:
    """Record ``i`` (``values(i)``: the flat data set's fields, or the nested one's) as Avro under
    ``schema``, framed in the registry wire format with ``schema_id``."""
    from fastavro import parse_schema

    from onceflow.decoding.schema_registry import wire_value

    parsed = parse_schema(schema)
    return lambda i: wire_value(schema_id, parsed, values(i))


def kept(records: int) -> int:
    """How many of records 0..records-1 pass the filter (what every sink must hold afterwards)."""
    return sum(1 for i in range(records) if amount_of(i) >= MIN_AMOUNT)


@dataclass(frozen=True)
class Dataset:
    topic: str
    records: int
    produce_s: float

    @property
    def bytes(self) -> int:
        return self.records * RECORD_BYTES


def create_topic(bootstrap: str, prefix: str, partitions: int = PARTITIONS, name: str | None = None) -> str:
    """A new uniquely named topic (``name``, or the prefix and a random suffix), returned once every
    partition has a leader."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = name or f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=10).topics.get(topic)
        leaders = [p.leader for p in meta.partitions.values()] if meta else []
        if len(leaders) == partitions and min(leaders) >= 0:
            return topic
        time.sleep(0.2)
    raise TimeoutError(f"topic {topic} has no leader for every partition after 30 s")


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    if topics:
        admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the futures
        for future in admin.delete_topics(topics).values():
            future.result(30)


def produce(
    bootstrap: str,
    records: int,
    prefix: str = "bench-in",
    value: Callable[[int], bytes] = record,
    name: str | None = None,
) -> Dataset:
    """Create a topic (see `create_topic`) and write records 0..records-1, record i (``value(i)``) to
    partition i % PARTITIONS."""
    from confluent_kafka import Producer

    topic = create_topic(bootstrap, prefix, name=name)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000, "compression.type": "none"}
    )
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value(i), key=str(i).encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"producing to {topic}: records left undelivered")
    return Dataset(topic, records, time.perf_counter() - started)
