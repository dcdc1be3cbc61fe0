"""The plan step's look at the reader schema: a change is taken or refused before the epoch exists.

Each planned epoch records the reader schema it reads with (its row type, in the ledger's pipelines
table). The next plan compares the spec's reader schema with it (`onceflow.schemas.evolution`): a refused
change stops the plan in one line naming the fields; a taken one is said in the plan's log, and the sinks'
plan checks, which run next, add the new columns before any task of the epoch writes. An Avro subject's
reader schema is the subject's latest when the plan runs (each slice pins it again when it opens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from onceflow.config import Settings
from onceflow.errors import ConfigError
from onceflow.ledger import Ledger
from onceflow.pipeline import METADATA_COLUMNS, AvroFormat, Pipeline
from onceflow.schemas.avro import defaulted_fields, envelope_row_schema
from onceflow.schemas.evolution import SchemaChange, compare
from onceflow.schemas.types import Struct, parse_type, render, with_nullable


@dataclass(frozen=True)
class ReaderSchema:
    """The reader schema this plan reads with, and how it differs from the last planned epoch's
    (``change`` None: the first epoch, or nothing changed)."""

    text: str
    change: SchemaChange | None

    def lines(self, pipeline: str) -> list[str]:
        """What the plan's log says of a taken change."""
        if self.change is None or not self.change.changed:
            return []
        parts = []
        if self.change.added:
            parts.append(f"new nullable fields {self.change.added} (the sinks add them as columns)")
        if self.change.widened:
            parts.append(f"widened fields {self.change.widened}")
        return [f"pipeline {pipeline!r}: the reader schema changed: {'; '.join(parts)}"]


def reader_row_type(spec: Pipeline) -> Struct:
    """The decoded records' row type, without the metadata columns."""
    from onceflow.decoding.records import row_columns

    fields = tuple(
        (name, with_nullable(parse_type(text), nullable))
        for name, text, nullable in row_columns(spec.format)
        if name not in METADATA_COLUMNS
    )
    return Struct(fields)


def check_reader_schema(spec: Pipeline, ledger: Ledger, settings: Settings) -> ReaderSchema:
    """The spec's reader schema against the last planned epoch's; refuses an incompatible change."""
    current = spec
    if isinstance(spec.format, AvroFormat) and not spec.format.pinned:
        from onceflow.decoding.avro_records import pinned

        current = pinned(spec, settings.schema_registry_url, settings.schema_registry_allow_insecure_auth)
    new = reader_row_type(current)
    text = render(new)
    old = ledger.reader_schema(spec.name)
    if old is None or old == text:
        return ReaderSchema(text, None)
    before = parse_type(old, f"pipeline {spec.name!r}: the recorded reader schema")
    assert isinstance(before, Struct)
    defaulted: frozenset[str] = frozenset()
    fmt = current.format
    if isinstance(fmt, AvroFormat) and fmt.reader_schema is not None:
        schema = json.loads(fmt.reader_schema)
        if fmt.changes is not None:  # change events: the fields are the envelope's row record's
            schema = envelope_row_schema("format.reader_schema", schema)
        defaulted = defaulted_fields(schema)
    change = compare(before, new, defaulted)
    if change.refused:
        raise ConfigError(
            f"pipeline {spec.name!r}: the reader schema's change is refused: {change.refusal()}"
        )
    return ReaderSchema(text, change)
