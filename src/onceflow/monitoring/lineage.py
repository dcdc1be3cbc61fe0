"""A pipeline's inputs and outputs named as the OpenLineage naming spec names datasets.

* Kafka topic: namespace ``kafka://{first bootstrap host}:{port}``, name ``{topic}``;
* PostgreSQL table: namespace ``postgres://{host}:{port}``, name ``{database}.{schema}.{table}``
  (schema ``public`` when the table names none);
* local files (the ``files`` sink's table folder): namespace ``file``, name the absolute path.

Plain names, no OpenLineage dependency: the Airflow operators wrap them in OpenLineage datasets
(`onceflow_airflow.lineage`). Sinks are told apart by their resolved config (``topic``; ``dsn`` and
``table``; ``root`` and ``table``), so a sink kind of one's own with the same keys is named too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from onceflow.config import Settings
from onceflow.pipeline import Pipeline, SinkSpec
from onceflow.sinks.registry import sink_kind


@dataclass(frozen=True, order=True)
class DatasetName:
    namespace: str
    name: str


def kafka_dataset(bootstrap: str, topic: str) -> DatasetName:
    first = bootstrap.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    return DatasetName(f"kafka://{host}:{port}", topic)


def postgres_dataset(dsn: str, table: str) -> DatasetName:
    url = urlsplit(dsn)
    database = unquote(url.path.lstrip("/")) or unquote(url.username or "")
    schema, _, name = table.rpartition(".")
    return DatasetName(
        f"postgres://{url.hostname or 'localhost'}:{url.port or 5432}",
        f"{database}.{schema or 'public'}.{name}",
    )


def file_dataset(path: str | Path) -> DatasetName:
    return DatasetName("file", str(Path(path).resolve()))


def sink_dataset(sink: SinkSpec, settings: Settings) -> DatasetName | None:
    """The dataset a sink makes visible, or None for a sink whose config names none of the above."""
    config: dict[str, Any] = sink_kind(sink.kind).config_for(sink, settings)
    if "topic" in config:
        bootstrap = config.get("bootstrap") or settings.kafka_bootstrap
        return kafka_dataset(str(bootstrap), str(config["topic"])) if bootstrap else None
    if "table" in config and config.get("dsn"):
        return postgres_dataset(str(config["dsn"]), str(config["table"]))
    if "table" in config and config.get("root"):
        return file_dataset(Path(str(config["root"])) / str(config["table"]))
    return None


def pipeline_datasets(spec: Pipeline, settings: Settings) -> tuple[list[DatasetName], list[DatasetName]]:
    """(inputs, outputs): the source's topics, and each of the pipeline's sinks that names a dataset."""
    inputs = [kafka_dataset(settings.kafka_bootstrap, topic) for topic in spec.source.topics]
    outputs = [d for d in (sink_dataset(sink, settings) for sink in spec.sinks) if d is not None]
    return inputs, outputs
