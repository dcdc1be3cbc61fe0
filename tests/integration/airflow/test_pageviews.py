"""The page views example through Airflow: per-minute counts over two epochs, late views kept apart."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from examples.orders.data import produce

from onceflow.ledger import EpochStatus, Ledger
from tests.integration.airflow.helpers import dags_test, epochs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MINUTE = 60_000


def _views(now_ms: int, count: int, *, late: bool, seed: int) -> list[dict[str, object]]:
    offset = 600_000 if late else 0
    return [
        {"page": f"/p{(seed + i) % 3}", "user": f"u{i}", "ts": now_ms - offset - (i * 7_000) % 50_000}
        for i in range(count)
    ]


def test_views_per_minute_over_two_epochs(airflow_env, make_topic, tmp_path, settings) -> None:
    topic = make_topic("pageviews")
    suffix = topic.removeprefix("pageviews")
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger.connect(ledger_url, check=False) as ledger:
        ledger.upgrade()
    home = tmp_path / "home"
    env = {
        **airflow_env,
        "ONCEFLOW_PAGEVIEWS_SUFFIX": suffix,
        "ONCEFLOW_LEDGER_URL": ledger_url,
        "ONCEFLOW_HOME": str(home),
    }
    sent: list[dict[str, object]] = []
    late_sent = 0
    for run in range(2):
        now = int(time.time() * 1000)
        batch = _views(now, 20, late=False, seed=run) + _views(now, 3 + run, late=True, seed=run)
        late_sent += 3 + run
        sent += batch[:20]
        produce(settings.kafka_bootstrap, topic, [(None, json.dumps(v).encode()) for v in batch])
        dags_test(env, "onceflow_pageviews")

    with Ledger.connect(ledger_url) as ledger:
        assert [e.status for e in ledger.epochs(f"pageviews{suffix}")] == [EpochStatus.COMMITTED] * 2
    assert len(epochs(ledger_url, f"pageviews{suffix}")) == 2

    from examples.pageviews.pipeline import read_late, read_views_per_minute

    root = home / "examples" / f"pageviews{suffix}"
    expected = Counter((int(v["ts"]) // MINUTE * MINUTE, str(v["page"])) for v in sent)  # type: ignore[call-overload]
    assert read_views_per_minute(root) == dict(expected)
    late = read_late(root)
    assert len(late) == late_sent
    assert all(row["delay_ms"] > 120_000 for row in late)
