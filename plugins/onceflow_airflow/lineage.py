"""OpenLineage facets of the operators: the pipeline's topics in, its sinks' tables, topics and folders
out, named by `onceflow.monitoring.lineage` after the OpenLineage naming spec.

The openlineage provider calls ``get_openlineage_facets_on_complete`` of each operator when a task
ends and sends the result through its configured transport (``[openlineage] transport``).
"""

from __future__ import annotations

from typing import Any

from onceflow.config import Settings
from onceflow.monitoring.lineage import pipeline_datasets
from onceflow.pipeline import Pipeline


def operator_lineage(spec: Pipeline, settings: Settings) -> Any:
    """An ``OperatorLineage`` with one input per topic and one output per sink that names a dataset."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset

    inputs, outputs = pipeline_datasets(spec, settings)
    return OperatorLineage(
        inputs=[Dataset(namespace=d.namespace, name=d.name) for d in inputs],
        outputs=[Dataset(namespace=d.namespace, name=d.name) for d in outputs],
    )
