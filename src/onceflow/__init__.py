"""onceflow: end-to-end exactly-once Kafka pipelines as Airflow-orchestrated Spark micro-batches.

The library holds the protocol (ledger, sources, sinks, state); Airflow DAGs, plugins and Spark entry
points are thin layers that import it. Nothing here imports Airflow or PySpark at module import time.
"""

__version__ = "0.1.0"
