"""Debezium's transaction metadata, read: which source transaction a change belongs to, and how many
changes each transaction wrote to each table.

With ``provide.transaction.metadata``, Debezium writes a ``BEGIN`` and an ``END`` event per source
transaction to a topic of its own (``<topic.prefix>.transaction``); the ``END`` lists, per table (its
"data collection", ``schema.table``), how many change events the transaction wrote. Each change event
gets a ``transaction`` block: the transaction's id, the event's place in the whole transaction and its
place among the transaction's events of its table (``data_collection_order``, from 1).

The PostgreSQL connector's ids are ``<xid>:<LSN>`` with the LSN of the event the id is attached to, so
the ``BEGIN``, the ``END`` and each change of one transaction carry different ids: the part before the
colon, PostgreSQL's transaction id, is what they share, and what is compared here.

Values come as the pipeline's format wrote them: JSON with or without the converter's schema wrapper, or
Avro through the registry (the 5-byte header, then the body). Nothing here imports Spark, the ledger or
the coordinator.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from onceflow.decoding.schema_registry import MAGIC_BYTE, WIRE_HEADER, SchemaRegistry

Document = Callable[[bytes], Any]


class TransactionMetadataError(ValueError):
    """A record of the transaction topic, or a change's transaction block, that is not Debezium's."""


@dataclass(frozen=True)
class ChangePlace:
    """Where one change event stands in its source transaction."""

    xid: str
    collection: str  # schema.table, as the END event names it
    order: int  # data_collection_order: 1 for the transaction's first change of this table


@dataclass(frozen=True)
class TransactionEnd:
    """A transaction's END: how many changes it wrote to each table."""

    xid: str
    counts: Mapping[str, int]


def source_xid(transaction_id: Any) -> str:
    """The source's own transaction id in a Debezium transaction id (``<xid>:<LSN>`` on PostgreSQL)."""
    if not isinstance(transaction_id, str) or not transaction_id:
        raise TransactionMetadataError(f"transaction id {transaction_id!r} is not a text")
    return transaction_id.split(":", 1)[0]


def json_document(value: bytes) -> Any:
    """A JSON converter's record, its schema wrapper (if any) taken off."""
    try:
        document = json.loads(value)
    except (UnicodeDecodeError, ValueError) as exc:
        raise TransactionMetadataError(f"not JSON ({exc})") from exc
    if isinstance(document, dict) and set(document) == {"schema", "payload"}:
        return document["payload"]
    return document


class AvroDocuments:
    """Avro records of the registry's wire format, read with their writer schemas (looked up once)."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry
        self._schemas: dict[int, Any] = {}

    def __call__(self, value: bytes) -> Any:
        from fastavro import parse_schema, schemaless_reader

        if len(value) < WIRE_HEADER.size or value[0] != MAGIC_BYTE:
            raise TransactionMetadataError("not a registry-framed Avro record (no magic byte)")
        _, schema_id = WIRE_HEADER.unpack_from(value)
        schema = self._schemas.get(schema_id)
        if schema is None:
            schema = parse_schema(json.loads(self.registry.schema_by_id(schema_id)))
            self._schemas[schema_id] = schema
        try:
            return schemaless_reader(io.BytesIO(value[WIRE_HEADER.size :]), schema, None)
        except Exception as exc:  # a body that is not its schema's
            raise TransactionMetadataError(f"Avro body of schema id {schema_id} does not decode") from exc


def change_place(document: Any) -> ChangePlace | None:
    """The transaction place of a change event (None: a tombstone, or a change outside any
    transaction, such as a row of the initial snapshot)."""
    if not isinstance(document, dict):
        return None
    block = document.get("transaction")
    if block is None:
        return None
    source = document.get("source")
    if not isinstance(block, dict) or not isinstance(source, dict):
        raise TransactionMetadataError("a change's transaction block or source block is not an object")
    try:
        order = int(block["data_collection_order"])
        collection = f"{source['schema']}.{source['table']}"
    except (KeyError, TypeError, ValueError) as exc:
        raise TransactionMetadataError(f"a change's transaction block lacks {exc}") from exc
    return ChangePlace(source_xid(block.get("id")), collection, order)


def boundary(document: Any) -> tuple[str, str, TransactionEnd | None]:
    """(``BEGIN`` or ``END``, xid, the END's counts) of a transaction topic's record."""
    if not isinstance(document, dict) or document.get("status") not in ("BEGIN", "END"):
        raise TransactionMetadataError("not a BEGIN or END event of Debezium's transaction topic")
    status, xid = str(document["status"]), source_xid(document.get("id"))
    if status == "BEGIN":
        return status, xid, None
    counts: dict[str, int] = {}
    for entry in document.get("data_collections") or ():
        try:
            counts[str(entry["data_collection"])] = int(entry["event_count"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TransactionMetadataError(f"an END's data_collections entry lacks {exc}") from exc
    return status, xid, TransactionEnd(xid, counts)
