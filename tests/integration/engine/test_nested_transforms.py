"""Transforms see nested records as Spark columns: explode() over an array of structs, a nested field by
its path, transform()/aggregate() over an array, and keyed state on a nested field, through whole epochs
on the real stack."""

from __future__ import annotations

import json
import sys
import uuid
from collections import Counter

import pytest
from confluent_kafka import Producer

from onceflow.config import Settings
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus
from onceflow.sinks.files import read_committed_table

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _fresh_pipelines(stack, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The pipelines module reads this test's names at import: import it afresh."""
    monkeypatch.delitem(sys.modules, "tests.integration.engine.nested_pipelines", raising=False)


def nested_orders(start: int, count: int) -> list[dict]:
    return [
        {
            "id": n,
            "items": [{"sku": f"s{n}-{i}", "qty": i + n % 3, "note": "dropped"} for i in range(n % 4)],
            "ctx": {"ip": f"10.0.0.{n % 3}", "tags": ["a"] if n % 2 else None},
            "counts": {"seen": n} if n % 5 else None,
        }
        for n in range(start, start + count)
    ]


def produce(bootstrap: str, topic: str, documents: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)
    producer.begin_transaction()
    for document in documents:
        producer.produce(topic, key=str(document["id"]).encode(), value=json.dumps(document).encode())
    producer.commit_transaction(30)


def test_explode_and_nested_paths_give_one_row_per_item(stack, settings) -> None:
    documents = nested_orders(0, 30)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], documents)
    outcome = run_epoch("tests.integration.engine.nested_pipelines:ITEMS", Settings.from_env())
    assert outcome.epoch.status == EpochStatus.COMMITTED
    table = read_committed_table(stack["ONCEFLOW_TEST_FILES"], "items")
    got = sorted(zip(*(table.column(c).to_pylist() for c in ("id", "sku", "qty", "ip")), strict=True))
    expected = sorted(
        (d["id"], item["sku"], item["qty"], d["ctx"]["ip"]) for d in documents for item in d["items"]
    )
    assert got == expected and len(got) > len(documents) // 2


def test_state_keyed_on_a_nested_field_folds_over_two_epochs(stack, settings) -> None:
    first, second = nested_orders(0, 25), nested_orders(25, 20)
    totals: Counter[str] = Counter()
    for batch in (first, second):
        produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], batch)
        outcome = run_epoch("tests.integration.engine.nested_pipelines:PER_IP", Settings.from_env())
        assert outcome.epoch.status == EpochStatus.COMMITTED
        for d in batch:
            totals[d["ctx"]["ip"]] += sum(item["qty"] for item in d["items"])
    table = read_committed_table(stack["ONCEFLOW_TEST_FILES"], "per_ip")
    assert table.column_names[:2] == ["ip", "qty"]
    # Each epoch delivers the touched keys with their folded value; the last epoch's are the totals.
    rows = list(zip(table.column("ip").to_pylist(), table.column("qty").to_pylist(), strict=True))
    last = dict(rows[-len(totals) :])
    assert last == dict(totals)
