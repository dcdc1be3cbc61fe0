"""The pipeline of the epochs console's browser test: JSON clicks into Parquet files.

Its names come from the environment, so that the Airflow API server, which finds the spec through
ONCEFLOW_PIPELINES, sees the same topic and folder as the test that ran its epochs.
"""

from __future__ import annotations

import os

from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

CONSOLE = Pipeline(
    name=os.environ.get("ONCEFLOW_CONSOLE_PIPELINE", "console-test"),
    source=KafkaSource(topics=(os.environ.get("ONCEFLOW_CONSOLE_TOPIC", "console-test"),)),
    format=JsonFormat(schema={"id": "int", "page": "string"}),
    sinks=(
        SinkSpec(
            "clicks_files",
            "files",
            {
                "root": os.environ.get("ONCEFLOW_CONSOLE_FILES", "/tmp/onceflow-console-test"),
                "table": "clicks",
            },
        ),
    ),
)
