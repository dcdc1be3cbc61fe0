"""A flood of distinct unknown schema ids costs a bounded number of registry calls, and loses no record.

The registry here is a real HTTP server on loopback that answers as the common REST API does (id 5
known, every other id unknown) and counts the calls it answers.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fastavro import parse_schema, schemaless_writer

from onceflow.decoding import avro_records
from onceflow.decoding.records import DeadLetter, KafkaRecord, RowDecoder
from onceflow.decoding.schema_registry import HttpSchemaRegistry
from onceflow.pipeline import AvroFormat

SCHEMA = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}


class Registry(BaseHTTPRequestHandler):
    calls: ClassVar[list[str]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.calls.append(self.path)
        if self.path == "/schemas/ids/5":
            status, answer = 200, {"schema": json.dumps(SCHEMA)}
        else:
            status, answer = 404, {"error_code": 40403, "message": "Schema not found"}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def registry() -> Iterator[HttpSchemaRegistry]:
    Registry.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield HttpSchemaRegistry(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


def framed(schema_id: int, a: int) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + schema_id.to_bytes(4, "big"))
    schemaless_writer(out, parse_schema(SCHEMA), {"a": a})
    return out.getvalue()


def decoder(tmp_path: Path, registry: HttpSchemaRegistry) -> RowDecoder:
    (tmp_path / "r.avsc").write_text(json.dumps(SCHEMA))
    return RowDecoder(AvroFormat(schema_file=str(tmp_path / "r.avsc")), 1_000_000, registry)


def record(value: bytes, offset: int) -> KafkaRecord:
    return KafkaRecord("t", 0, offset, 0, None, value)


def test_a_task_asks_the_registry_a_bounded_number_of_times_and_keeps_every_record(
    tmp_path: Path, registry: HttpSchemaRegistry
) -> None:
    task = decoder(tmp_path, registry)
    flood = 3 * avro_records.MAX_LOOKUPS_PER_TASK
    decoded = [task.decode(record(framed(1000 + n, n), n)) for n in range(flood)]
    assert len(Registry.calls) == avro_records.MAX_LOOKUPS_PER_TASK
    assert all(isinstance(d, DeadLetter) for d in decoded)
    letters = [d for d in decoded if isinstance(d, DeadLetter)]
    assert [d.offset for d in letters] == list(range(flood))  # nothing lost
    assert {d.code for d in letters} == {"unknown_schema_id"}
    assert "not looked up" in letters[-1].reason and "not looked up" not in letters[0].reason
    # A known id is still read (the process cache serves it once looked up, past the cap too).
    other = decoder(tmp_path, registry)
    assert other.decode(record(framed(5, 7), flood))[0] == 7


def test_failed_ids_are_remembered_per_process_bounded_and_for_a_while(
    tmp_path: Path, registry: HttpSchemaRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = decoder(tmp_path, registry)
    for n in range(10):
        assert isinstance(first.decode(record(framed(2000 + n, n), n)), DeadLetter)
    assert len(Registry.calls) == 10
    # Another task of the process asks nothing about the ids refused already.
    second = decoder(tmp_path, registry)
    for n in range(10):
        assert isinstance(second.decode(record(framed(2000 + n, n), n)), DeadLetter)
    assert len(Registry.calls) == 10
    # The memory is bounded: the oldest refusals go first.
    monkeypatch.setattr(avro_records, "MAX_FAILED_IDS", 4)
    third = decoder(tmp_path, registry)
    for n in range(6):
        third.decode(record(framed(3000 + n, n), n))
    assert len(avro_records._FAILED) == 4
    # And a refusal is forgotten after a while: the registry may have learned the id since.
    monkeypatch.setattr(avro_records, "FAILED_ID_TTL_S", 0.0)
    asked = len(Registry.calls)
    decoder(tmp_path, registry).decode(record(framed(3005, 0), 0))
    assert len(Registry.calls) == asked + 1
