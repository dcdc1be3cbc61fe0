"""Avro arrays of items that take no bytes (null, a record of no fields, a fixed of size 0): a body's block
count alone says how many there are, so a few bytes can ask fastavro for 2^60 items, which it allocates
or loops over. Such writer schemas are refused, each record of them a dead letter; other collections, whose
every item takes a byte, stay bounded by the body.

Each decode runs in a child interpreter with a time and memory limit, so a decoder that loops fails the
test instead of holding it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EMPTY = {"type": "record", "name": "Empty", "fields": []}
FIXED0 = {"type": "fixed", "name": "Nothing", "size": 0}
NULLS = {"type": "record", "name": "Nulls", "fields": [{"name": "n", "type": "null"}]}

CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from onceflow.decoding.records import DeadLetter, KafkaRecord, RowDecoder
from onceflow.decoding.schema_registry import FolderSchemaRegistry
from onceflow.pipeline import AvroFormat

folder, wire, value = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
fmt = AvroFormat(schema_file=folder + "/reader.avsc", wire=wire)
decoded = RowDecoder(fmt, 1_000_000, FolderSchemaRegistry(folder)).decode(
    KafkaRecord("t", 0, 0, None, None, value)
)
print(json.dumps(decoded.reason if isinstance(decoded, DeadLetter) else list(decoded[:-4])))
"""


def zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def record(*fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "R", "fields": [{"name": n, "type": t} for n, t in fields]}


def decoded(tmp_path: Path, reader: dict[str, Any], writer: dict[str, Any], wire: str, body: bytes) -> Any:
    """The row's fields or the dead letter's reason of ``body`` (written by ``writer``, id 9)."""
    (tmp_path / "reader.avsc").write_text(json.dumps(reader))
    (tmp_path / "w.avsc").write_text(json.dumps(writer))
    entry = {"id": 9, "subject": "s", "version": 1, "file": "w.avsc"}
    (tmp_path / "registry.json").write_text(json.dumps({"schemas": [entry]}))
    value = body if wire == "plain" else b"\x00\x00\x00\x00\x09" + body
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path), wire, value.hex()],
            capture_output=True,
            timeout=10,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the decoder was still reading a 2^60-item block after 10 s")
    assert done.returncode == 0, done.stderr.decode()[-500:]
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("items", "shown"),
    [("null", "null"), (EMPTY, "record Empty"), (FIXED0, "fixed Nothing"), (NULLS, "record Nulls")],
)
def test_a_writer_with_an_array_of_zero_width_items_is_refused_as_a_dead_letter(
    tmp_path: Path, items: Any, shown: str
) -> None:
    """The reader has no such field: fastavro would skip the array, item by item, for ever."""
    writer = record(("id", "long"), ("pad", ["null", {"type": "array", "items": items}]))
    body = zigzag(1) + zigzag(1) + zigzag(2**60)  # id 1, the union's array branch, a block of 2^60
    assert decoded(tmp_path, record(("id", "long")), writer, "registry", body) == (
        f"incompatible_schema: writer schema id 9: the array at field 'pad' holds items of no width "
        f"({shown}), which a few bytes can make endless: not read"
    )


def test_the_formats_own_writer_schema_with_such_an_array_is_refused_as_a_dead_letter(tmp_path: Path) -> None:
    schema = record(("id", "long"), ("blobs", {"type": "array", "items": FIXED0}))
    body = zigzag(1) + zigzag(2**60)
    assert decoded(tmp_path, schema, schema, "plain", body) == (
        "incompatible_schema: writer schema of the format: the array at field 'blobs' holds items of no "
        "width (fixed Nothing), which a few bytes can make endless: not read"
    )


def test_collections_whose_items_take_bytes_are_bounded_by_the_body(tmp_path: Path) -> None:
    maps = record(("id", "long"), ("m", {"type": "map", "values": "null"}))  # each entry has a key
    body = zigzag(1) + zigzag(2**60)
    assert decoded(tmp_path, record(("id", "long")), maps, "registry", body).startswith(
        "malformed_avro: writer schema id 9"
    )
    longs = record(("id", "long"), ("a", {"type": "array", "items": "long"}))
    assert decoded(tmp_path, longs, longs, "registry", body).startswith("malformed_avro: writer schema id 9")
    good = zigzag(1) + zigzag(2) + zigzag(5) + zigzag(6) + zigzag(0)
    assert decoded(tmp_path, longs, longs, "registry", good) == [1, [5, 6]]
