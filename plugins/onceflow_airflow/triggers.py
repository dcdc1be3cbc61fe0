"""The triggerer's half of event-driven runs: announce a pipeline's new records as asset events.

`NewRecordsTrigger` runs in ``airflow triggerer`` as the watcher of the pipeline's asset (see
`onceflow_airflow.dag_factory.new_records_asset`). Every ``poll_interval_s`` it compares Kafka's last
stable offsets with the ledger's committed positions (`onceflow.monitoring.new_records`) and fires an event
when `should_announce` says so; each event queues a run of the DAG. It reads and consumes nothing: no
consumer group, no offset commit. Which records a run processes is decided by that run's plan, from
the ledger, never by the event.

The triggerer imports this module by its class path, ``onceflow_airflow.triggers.NewRecordsTrigger``:
Airflow puts the plugins folder on ``sys.path`` of the triggerer as of every other component.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from onceflow.errors import OnceflowError
from onceflow.ledger import Ledger
from onceflow.monitoring.new_records import Announced, Backlog, describe, read_backlog, should_announce
from onceflow.pipeline import Pipeline, load_pipeline
from onceflow_airflow.hooks import OnceflowHook

CLASSPATH = "onceflow_airflow.triggers.NewRecordsTrigger"


class NewRecordsTrigger(BaseEventTrigger):
    """Fires when the pipeline's topics hold records beyond its committed position.

    ``repeat_s``: how long the same unprocessed state waits before it is announced again (records left
    by an aborted run); see `onceflow.monitoring.new_records.should_announce`.
    """

    def __init__(
        self,
        *,
        pipeline: str,
        ledger_conn_id: str = "onceflow_ledger",
        kafka_conn_id: str = "onceflow_kafka",
        postgres_conn_id: str = "onceflow_postgres",
        poll_interval_s: float = 5.0,
        repeat_s: float = 300.0,
    ) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.ledger_conn_id = ledger_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.postgres_conn_id = postgres_conn_id
        self.poll_interval_s = float(poll_interval_s)
        self.repeat_s = float(repeat_s)
        self._ledger: Ledger | None = None
        self._spec: Pipeline | None = None
        self._bootstrap = ""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            CLASSPATH,
            {
                "pipeline": self.pipeline,
                "ledger_conn_id": self.ledger_conn_id,
                "kafka_conn_id": self.kafka_conn_id,
                "postgres_conn_id": self.postgres_conn_id,
                "poll_interval_s": self.poll_interval_s,
                "repeat_s": self.repeat_s,
            },
        )

    def _read(self) -> Backlog:
        """Blocking: runs in a worker thread, off the triggerer's event loop."""
        if self._ledger is None or self._spec is None:
            hook = OnceflowHook(self.ledger_conn_id, self.kafka_conn_id, self.postgres_conn_id)
            settings = hook.settings()
            self._spec = load_pipeline(self.pipeline)
            self._bootstrap = settings.kafka_bootstrap
            self._ledger = Ledger.connect(settings.ledger_url)
        return read_backlog(self._spec, self._ledger, self._bootstrap)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        last: Announced | None = None
        said = ""
        try:
            while True:
                try:
                    backlog = await asyncio.to_thread(self._read)
                except (OnceflowError, ImportError) as exc:
                    line = f"onceflow: cannot tell whether {self.pipeline} has new records: {exc}"
                    if line != said:  # once per distinct problem, not every poll
                        self.log.warning("%s", line)
                        said = line
                    await asyncio.sleep(self.poll_interval_s)
                    continue
                said = ""
                now = time.monotonic()
                if should_announce(backlog, last, now, self.repeat_s):
                    last = Announced(backlog.state, now)
                    self.log.info("onceflow: %s: announcing", describe(backlog))
                    yield TriggerEvent(
                        {
                            "pipeline": backlog.pipeline,
                            "new_offsets": backlog.records,
                            "last_stable": {f"{t}[{p}]": stable for t, p, _, stable in backlog.state},
                        }
                    )
                await asyncio.sleep(self.poll_interval_s)
        finally:
            await self.cleanup()

    async def cleanup(self) -> None:
        ledger, self._ledger = self._ledger, None
        if ledger is not None:
            ledger.close()
