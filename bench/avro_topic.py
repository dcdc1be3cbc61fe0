"""The Avro steps' data sets: the throughput step's records (or the nested step's orders) as Avro in the
schema registry wire format.

The writer schema is registered in the deployment's registry server (``ONCEFLOW_SCHEMA_REGISTRY_URL``,
http(s)://), so that onceflow resolves it by id as it would a producer's; without a registry server, it is
kept in a schema folder under the workdir (id 1) and the pipeline reads through that folder instead.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.dataset import AVRO_SCHEMA, Dataset, avro_record, fields, produce
from onceflow import redact
from onceflow.config import Settings
from onceflow.decoding.schema_registry import FolderSchemaRegistry, HttpSchemaRegistry
from onceflow.pipeline import AvroFormat


@dataclass(frozen=True)
class AvroTopic:
    data: Dataset
    fmt: AvroFormat  # the reader schema from a file, writer schemas by id from ``settings``' registry
    settings: Settings  # with the registry the pipeline resolves schema ids through
    schema_id: int
    registry: str  # where the schema was registered, for the report (no credentials)
    value_bytes: float  # mean size of a value, the 5-byte header included


def produce_avro(
    settings: Settings,
    records: int,
    workdir: Path,
    avro_schema: dict[str, Any] = AVRO_SCHEMA,
    values: Callable[[int], dict[str, Any]] = fields,
    prefix: str = "bench-avro",
) -> AvroTopic:
    """Register ``avro_schema``, then write records 0..records-1 (``values(i)``; the throughput step's
    records by default) in it."""
    schema = json.dumps(avro_schema)
    folder = workdir / f"avro-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    reader = folder / "bench-record.avsc"
    reader.write_text(schema, encoding="utf-8")
    # Registered under the topic's own subject, as a producer with Confluent's default naming does: the
    # JVM decoder plans the writer schemas of ``<topic>-value`` for a reader schema from a file.
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    url = settings.schema_registry_url
    if url is not None and url.startswith(("http://", "https://")):
        schema_id = HttpSchemaRegistry(url).register(f"{topic}-value", schema)
        shown = f"schema registry {redact.url(url)}"
    else:
        schema_id = 1
        entry = {"id": 1, "subject": f"{topic}-value", "version": 1, "file": reader.name}
        manifest = {"schemas": [entry]}
        (folder / FolderSchemaRegistry.MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
        settings = dataclasses.replace(settings, schema_registry_url=f"file://{folder.resolve()}")
        shown = "a schema folder (no registry server configured)"
    value = avro_record(schema_id, avro_schema, values)
    sample = range(0, records, max(1, records // 1000))
    value_bytes = sum(len(value(i)) for i in sample) / max(len(sample), 1)
    data = produce(settings.kafka_bootstrap, records, value=value, name=topic)
    fmt = AvroFormat(schema_file=str(reader), wire="registry")
    return AvroTopic(data, fmt, settings, schema_id, shown, value_bytes)
