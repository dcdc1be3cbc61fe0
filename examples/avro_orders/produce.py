"""Produce example orders in the schema registry wire format, with schema version 1 or 2.

``python -m examples.avro_orders.produce --version 1 --start 0 --count 50`` writes orders 0..49 with
``order-v1.avsc``; ``--version 2`` with ``order-v2.avsc`` (the producer's evolution). With a registry
server, both versions are registered under ``avro-orders-value`` first (registering a schema again
returns its id); with the folder of schemas, its manifest's ids are used. The deployment's settings
(``ONCEFLOW_KAFKA_BOOTSTRAP``, ``ONCEFLOW_SCHEMA_REGISTRY_URL``) say where.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from decimal import Decimal
from typing import Any

from examples.avro_orders.pipeline import INPUT_TOPIC, SCHEMAS, SUBJECT
from onceflow.config import Settings
from onceflow.decoding.schema_registry import (
    FolderSchemaRegistry,
    HttpSchemaRegistry,
    SchemaRegistry,
    registry_at,
    wire_value,
)

VERSIONS = {1: "order-v1.avsc", 2: "order-v2.avsc"}
START = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.UTC)


def order(i: int, version: int) -> dict[str, Any]:
    """Order ``i`` as version ``version`` writes it: what the table must then hold for it."""
    fields: dict[str, Any] = {
        "id": i,
        "customer": f"c{i % 7}",
        "amount": Decimal(1000 + 37 * i) / 100,
        "placed_at": START + dt.timedelta(minutes=i),
    }
    if version == 2:
        fields["channel"] = "web" if i % 2 else "shop"
    return fields


def schema_id(registry: SchemaRegistry, version: int) -> int:
    """The id of a version: registered in a registry server, listed in a folder's manifest."""
    text = (SCHEMAS / VERSIONS[version]).read_text()
    if isinstance(registry, HttpSchemaRegistry):
        return registry.register(SUBJECT, text)
    if isinstance(registry, FolderSchemaRegistry):
        manifest = json.loads((registry.folder / FolderSchemaRegistry.MANIFEST).read_text())
        return next(int(e["id"]) for e in manifest["schemas"] if e["file"] == VERSIONS[version])
    raise TypeError(f"cannot find schema ids in {registry!r}")


def framed(schema_id: int, schema: Any, record: dict[str, Any]) -> bytes:
    return wire_value(schema_id, schema, record)


def produce(settings: Settings, version: int, start: int, count: int, topic: str = INPUT_TOPIC) -> None:
    from confluent_kafka import Producer
    from fastavro import parse_schema

    registry = registry_at(settings.schema_registry_url, settings.schema_registry_allow_insecure_auth)
    if registry is None:
        raise SystemExit(
            "set ONCEFLOW_SCHEMA_REGISTRY_URL (a registry server, or file://<this folder>/schemas)"
        )
    writer_id = schema_id(registry, version)
    schema = parse_schema(json.loads((SCHEMAS / VERSIONS[version]).read_text()))
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    for i in range(start, start + count):
        producer.produce(topic, key=f"order-{i}".encode(), value=framed(writer_id, schema, order(i, version)))
    if producer.flush(30):
        raise SystemExit(f"{topic}: some orders were not delivered within 30 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", type=int, choices=sorted(VERSIONS), default=1)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=50)
    args = parser.parse_args()
    produce(Settings.from_env(), args.version, args.start, args.count)
    print(f"produced orders {args.start}..{args.start + args.count - 1} with schema version {args.version}")


if __name__ == "__main__":
    main()
