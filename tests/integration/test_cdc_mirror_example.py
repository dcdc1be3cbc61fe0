"""The CDC mirror example as README runs it: a source table captured by Debezium, mirrored epoch after
epoch into a PostgreSQL replica and an Iceberg table through inserts, updates, deletes and a column
added at the source; after each epoch both mirrors equal the source, row for row."""

from __future__ import annotations

import importlib
import uuid
from pathlib import Path

import psycopg
import pytest

from onceflow.config import Settings
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus, Ledger
from tests.cdc import require_connect

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_the_cdc_mirror_example_keeps_both_mirrors_equal_to_the_source(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_connect(settings)
    from examples.cdc_mirror import pipeline, source

    monkeypatch.setenv("ONCEFLOW_CDC_MIRROR_SUFFIX", f"_{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("ONCEFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("ONCEFLOW_LEDGER_URL", f"sqlite:///{tmp_path}/ledger.db")
    importlib.reload(pipeline)
    importlib.reload(source)
    run_settings = Settings.from_env()
    with Ledger.connect(run_settings.ledger_url, check=False) as ledger:
        ledger.upgrade()

    def epoch(spec: str) -> None:
        done = run_epoch(f"examples.cdc_mirror.pipeline:{spec}", run_settings, executor="local")
        assert done.epoch.status == EpochStatus.COMMITTED

    try:
        assert source.main(["start"]) == 0
        epoch("CDC_MIRROR")
        assert source.main(["compare"]) == 0

        assert source.main(["change", "--round", "1"]) == 0
        epoch("CDC_MIRROR")
        assert source.compare(run_settings, with_tier=False) == []

        assert source.main(["add-column"]) == 0
        assert source.main(["change", "--round", "2"]) == 0
        epoch("CDC_MIRROR_V2")
        assert source.compare(run_settings, with_tier=True) == []
        rows = source.source_rows(run_settings.pg_dsn, with_tier=True)
        assert 3 not in rows and 204 not in rows  # deleted at the source
        assert any(r[-1] == "gold" for r in rows.values())
        assert source.main(["compare"]) == 0
    finally:
        source.stop(run_settings.pg_dsn)
        with psycopg.connect(run_settings.pg_dsn, autocommit=True) as conn:
            for table in (
                pipeline.SOURCE_TABLE,
                pipeline.REPLICA_TABLE,
                f"{pipeline.REPLICA_TABLE}_onceflow_changes",
            ):
                conn.execute(f"DROP TABLE IF EXISTS {table}")
        monkeypatch.undo()
        importlib.reload(pipeline)
        importlib.reload(source)
