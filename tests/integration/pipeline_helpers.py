"""What the tests of whole pipelines share: the page-view records they read, the pipeline over them, the
settings of a run with its own ledger and home, and the epochs that ledger committed."""

from __future__ import annotations

import json
import os
from pathlib import Path

from confluent_kafka import Producer

from onceflow.config import Settings
from onceflow.ledger import Epoch, Ledger
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

VIEWS_FORMAT = JsonFormat(schema={"id": "int", "page": "string"})


def produce_views(bootstrap: str, topic: str, ids: range, pages: int = 5) -> None:
    """One page view per id, keyed by it, into partition ``id % 2``: each partition's ids rise."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in ids:
        producer.produce(
            topic, key=str(i), value=json.dumps({"id": i, "page": f"/p{i % pages}"}), partition=i % 2
        )
    producer.flush()


def views_pipeline(
    name: str, topic: str, sink: SinkSpec, max_records_per_partition: int = 40, max_records_per_task: int = 20
) -> Pipeline:
    """The page views of ``topic`` into one sink, in epochs small enough that a run makes several."""
    return Pipeline(
        name=name,
        source=KafkaSource(topics=(topic,)),
        format=VIEWS_FORMAT,
        sinks=(sink,),
        max_records_per_partition=max_records_per_partition,
        max_records_per_task=max_records_per_task,
    )


def settings_with_own_ledger(folder: Path, home: Path | None = None) -> Settings:
    """The stack's settings with a fresh SQLite ledger in ``folder`` (its schema created) and
    ``ONCEFLOW_HOME`` there too (or at ``home``), so a run shares no state with another test's."""
    settings = Settings.from_env(
        {
            **os.environ,
            "ONCEFLOW_LEDGER_URL": f"sqlite:///{folder}/ledger.db",
            "ONCEFLOW_HOME": str(home or folder),
        }
    )
    with Ledger.connect(settings.ledger_url, check=False) as ledger:
        ledger.upgrade()
    return settings


def committed_epochs(settings: Settings, pipeline: str) -> list[Epoch]:
    """The pipeline's committed epochs in the ledger, oldest first."""
    with Ledger.connect(settings.ledger_url) as ledger:
        return [e for e in ledger.epochs(pipeline) if e.status.value == "COMMITTED"]


def epochs_that_read(settings: Settings, pipeline: str) -> list[Epoch]:
    """The committed epochs that read at least one record (each makes one table version or snapshot)."""
    return [e for e in committed_epochs(settings, pipeline) if any(not r.is_empty for r in e.ranges)]
