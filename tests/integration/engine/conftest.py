"""The engine tests' stack: unique names per test, exported so that the spark-submit child sees them."""

from __future__ import annotations

import sys
import uuid

import pytest

from onceflow.ledger import Ledger


@pytest.fixture
def stack(settings, make_topic, pg_connect, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A unique topic (3 partitions), table, files root, state root and SQLite ledger."""
    suffix = uuid.uuid4().hex[:8]
    topic = make_topic("engine", partitions=3)
    env = {
        "ONCEFLOW_TEST_PIPELINE": f"engine-{suffix}",
        "ONCEFLOW_TEST_TOPIC": topic,
        "ONCEFLOW_TEST_TABLE": f"engine_orders_{suffix}",
        "ONCEFLOW_TEST_FILES": str(tmp_path / "files"),
        "ONCEFLOW_HOME": str(tmp_path / "home"),
        "ONCEFLOW_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.db'}",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # The spec module reads these variables at import: make this process import it afresh too.
    monkeypatch.delitem(sys.modules, "tests.integration.engine.pipelines", raising=False)
    ledger = Ledger.connect(env["ONCEFLOW_LEDGER_URL"], check=False)
    ledger.upgrade()
    ledger.close()
    yield env
    pg_connect(autocommit=True).execute(f"DROP TABLE IF EXISTS {env['ONCEFLOW_TEST_TABLE']}")
