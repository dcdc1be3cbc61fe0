"""Rows as Avro records in the schema registry wire format, for the Kafka sink's ``value_format: avro``.

The schema is the subject's latest in the registry, with its id in every record's header, as producers
configured to use the latest registered version do: the sink registers nothing, so what it writes is
always a schema the registry's compatibility rules accepted. Runs in write tasks: no ledger here.

Nested values are written as the schema declares them: a row holds a struct or a map as a dict and an
array as a list, as fastavro takes records, maps and arrays (a batch's maps are made dicts first,
`onceflow.sinks._kafka_batches.python_rows`), and timestamps, dates and decimals as the logical types do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from onceflow.decoding.schema_registry import SchemaNotFound, wire_value
from onceflow.errors import ConfigError
from onceflow.sinks.errors import RowError


class AvroValues:
    """Encodes rows as {key, value} records of one subject's latest schema."""

    def __init__(
        self,
        registry_url: str | None,
        subject: str,
        key_column: str | None,
        where: str,
        allow_insecure_auth: bool = False,
    ) -> None:
        if registry_url is None:
            raise ConfigError(
                f"{where}: value_format 'avro' needs a schema registry: set schema_registry_url "
                "or ONCEFLOW_SCHEMA_REGISTRY_URL"
            )
        self.registry_url, self.subject, self.key_column, self.where = (
            registry_url,
            subject,
            key_column,
            where,
        )
        self.allow_insecure_auth = allow_insecure_auth
        self._schema: tuple[int, Any] | None = None

    def _latest(self) -> tuple[int, Any]:
        """The subject's latest (id, parsed schema), asked once per writer: one look-up per task, and a
        new version reaches the next task even in a long-lived worker."""
        if self._schema is None:
            from fastavro import parse_schema

            from onceflow.decoding.avro_records import registry_for

            registry = registry_for(self.registry_url, self.allow_insecure_auth)
            assert registry is not None
            try:
                latest = registry.latest(self.subject)  # RegistryUnavailable fails the task
            except SchemaNotFound as exc:
                raise ConfigError(f"{self.where}: {exc}; register the value schema first") from exc
            self._schema = (latest.id, parse_schema(json.loads(latest.schema)))
        return self._schema

    def record(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """One row as the sink's {key, value}: the key column's text, the framed Avro body."""
        if not isinstance(row, Mapping):
            raise RowError(f"{self.where}: a row must be a mapping, not {type(row).__name__}")
        schema_id, schema = self._latest()
        try:
            value = wire_value(schema_id, schema, row)
        except Exception as exc:  # fastavro raises many kinds for a value its schema cannot hold
            detail = " ".join(str(exc).split())[:300]
            which = f"schema id {schema_id} of subject {self.subject!r}"
            raise RowError(f"{self.where}: a row does not fit {which}: {detail}") from exc
        key = None
        if self.key_column is not None:
            if self.key_column not in row:
                raise RowError(f"{self.where}: key_column {self.key_column!r} is not among the row's columns")
            key = None if row[self.key_column] is None else str(row[self.key_column])
        return {"key": key, "value": value}
