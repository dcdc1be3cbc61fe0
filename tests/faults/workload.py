"""What the harness feeds a pipeline: good records, records of aborted transactions, and bad input.

Every record's fate is known in advance, so the invariants can be checked from the outputs alone:
good ids must appear exactly once in every exactly-once sink, aborted ids never, and every bad record
must be a dead letter with the expected reason at its exact (partition, offset).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onceflow.decoding.schema_registry import wire_value
from tests.faults.pipelines import AVRO_SUBJECT, MAX_RECORD_BYTES

ABORTED_BASE = 1_000_000  # aborted ids live in their own range, so they are recognizable anywhere

# Bad records, by the reason their dead letter must carry (the prefix before ':').
BAD_INPUT: dict[str, tuple[bytes | None, bytes]] = {
    "malformed_json": (b"bad", b'{"id": 1, "payload": '),
    "wrong_type": (b"bad", b'{"id": "seven", "payload": "x"}'),
    "missing_field": (b"bad", b'{"payload": "no id"}'),
    "oversized": (b"bad", json.dumps({"id": 5, "payload": "x" * MAX_RECORD_BYTES}).encode()),
    "missing_key": (None, b'{"id": 6, "payload": "no key"}'),
    "not_utf8": (b"bad", b'{"id": 7, "payload": "\xff\xfe"}'),
}


# The Avro pipeline's records: written with schema id 1 of a folder registry, framed as the registry's
# wire format (magic byte 0, the 4-byte id, the body).
AVRO_SCHEMA = {
    "type": "record",
    "name": "Record",
    "namespace": "onceflow.faults",
    "fields": [{"name": "id", "type": "long"}, {"name": "payload", "type": "string"}],
}
AVRO_ID = 1


def json_value(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record).encode()


def avro_value(record: Mapping[str, Any], schema_id: int = AVRO_ID) -> bytes:
    from fastavro import parse_schema

    return wire_value(schema_id, parse_schema(AVRO_SCHEMA), record)


def avro_registry(folder: Path) -> str:
    """A folder registry holding the writer schema as the subject's only version; its URL."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "record.avsc").write_text(json.dumps(AVRO_SCHEMA))
    entry = {"id": AVRO_ID, "subject": AVRO_SUBJECT, "version": 1, "file": "record.avsc"}
    (folder / "registry.json").write_text(json.dumps({"schemas": [entry]}))
    return f"file://{folder}"


# Bad Avro records, by the reason their dead letter must carry.
AVRO_BAD_INPUT: dict[str, tuple[bytes | None, bytes]] = {
    "unknown_schema_id": (b"bad", avro_value({"id": 8, "payload": "unknown id"}, schema_id=99)),
    "malformed_avro": (b"bad", avro_value({"id": 9, "payload": "cut"})[:-2]),
    "bad_magic_byte": (b"bad", b'{"id": 10, "payload": "json"}'),
}


@dataclass
class Workload:
    """Everything produced to the input topic so far, with each record's position."""

    topic: str
    partitions: int
    good: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (partition, offset)
    aborted: set[int] = field(default_factory=set)
    bad: dict[tuple[int, int], str] = field(default_factory=dict)  # (partition, offset) -> reason
    next_id: int = 0
    encode: Callable[[Mapping[str, Any]], bytes] = json_value  # a record's value
    bad_input: Mapping[str, tuple[bytes | None, bytes]] = field(default_factory=lambda: BAD_INPUT)

    def produce(self, bootstrap: str, count: int, *, aborted: int = 0, bad: tuple[str, ...] = ()) -> None:
        """One committed transaction of ``count`` good records (plus ``bad`` ones), then ``aborted``
        records in a transaction that is aborted."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"wl-{uuid.uuid4().hex}"})
        producer.init_transactions(30)
        delivered: list[tuple[Any, int]] = []

        def remember(tag: Any) -> Any:
            def on_delivery(err: Any, msg: Any) -> None:
                assert err is None, err
                delivered.append((tag, (msg.partition(), msg.offset())))

            return on_delivery

        producer.begin_transaction()
        for _ in range(count):
            record_id = self.next_id
            self.next_id += 1
            partition = record_id % self.partitions
            value = self.encode({"id": record_id, "payload": f"p{record_id}"})
            producer.produce(
                self.topic,
                key=str(record_id).encode(),
                value=value,
                partition=partition,
                on_delivery=remember(("good", record_id)),
            )
        for i, reason in enumerate(bad):
            key, value = self.bad_input[reason]
            producer.produce(
                self.topic,
                key=key,
                value=value,
                partition=i % self.partitions,
                on_delivery=remember(("bad", reason)),
            )
        producer.commit_transaction(30)
        if aborted:
            producer.begin_transaction()
            for i in range(aborted):
                record_id = ABORTED_BASE + len(self.aborted) + i
                value = self.encode({"id": record_id, "payload": "aborted"})
                producer.produce(
                    self.topic, key=str(record_id).encode(), value=value, partition=i % self.partitions
                )
                self.aborted.add(record_id)
            producer.flush(30)
            producer.abort_transaction(30)
        for (kind, what), position in delivered:
            if kind == "good":
                self.good[what] = position
            else:
                self.bad[position] = what

    def rows(self) -> list[dict[str, Any]]:
        """The good records as the sinks should hold them."""
        return [{"id": i, "payload": f"p{i}"} for i in sorted(self.good)]
