"""Send onceflow's metrics (`onceflow.monitoring.metrics`) through Airflow's own metrics client.

In a task, Airflow's task runner sets up ``airflow.sdk.observability.stats`` from the ``[metrics]``
section (StatsD with ``statsd_on``, OpenTelemetry with ``otel_on``, or nothing), so onceflow's figures
go wherever Airflow's go, under Airflow's prefix (``statsd_prefix``, ``airflow`` by default):
``airflow.onceflow.<pipeline>.…``. Metrics are best effort: a failure to send never fails a task.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from airflow.sdk.observability import stats

from onceflow.monitoring.metrics import Metric

log = logging.getLogger(__name__)


def emit(metrics: Iterable[Metric]) -> int:
    """Send each metric as a counter, a gauge or a timing (milliseconds); returns how many were sent."""
    sent = 0
    for metric in metrics:
        try:
            if metric.kind == "count":
                stats.incr(metric.name, count=int(metric.value), tags=metric.tags)
            elif metric.kind == "gauge":
                stats.gauge(metric.name, metric.value, tags=metric.tags)
            else:
                stats.timing(metric.name, metric.value, tags=metric.tags)
        except Exception as exc:  # a metrics backend's problem must not fail the epoch's step
            log.warning("onceflow: metric %s not sent: %s", metric.name, exc)
            continue
        sent += 1
    return sent
