"""Each source partition keeps its order in the outputs (invariant 10), on every read path.

Every input partition interleaves good records with records that fail the JVM's checks: some Python
then turns into rows (an escaped surrogate pair), some into dead letters (malformed, wrong type), and
an aborted transaction leaves invisible records and markers between them. The pipeline's transform
drops some rows and adds a column; its Kafka sink is keyed by source partition and its files sink
keeps every row's position, so each output shows whether a source partition's records kept their
offset order. It runs on the warm runtime (the Spark Connect server of ONCEFLOW_SPARK_REMOTE) on both
JSON read paths (the default Python reader, and Spark's Kafka source with ONCEFLOW_JSON_READ=jvm),
through spark-submit with Spark's Kafka source on the classpath and the JVM read path chosen (in one
pass), through spark-submit without it (the Python read path) and, without the transform, on the local
executor; and with a transform that shuffles (one job per sink, each source partition put back in order).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer

from onceflow.config import Settings
from onceflow.engine import runner
from onceflow.ledger import EpochStatus, Ledger
from onceflow.sinks.files import read_committed_table
from tests.faults.harness import spark_conf_with_kafka
from tests.faults.invariants import files_order_violations, kafka_records, order_violations

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 3
PER_PARTITION = 24
# Record n of a partition, by n % 6: three good ones, one good only for Python, two dead letters.
SHAPES = ("good", "python_good", "good", "malformed", "good", "wrong_type")


def _value(record_id: int, shape: str) -> bytes:
    if shape == "python_good":  # an escaped surrogate pair: the JVM's checks send it to Python
        return json.dumps({"id": record_id, "payload": "\U0001f600"}, ensure_ascii=True).encode()
    if shape == "malformed":
        return b'{"id": ' + str(record_id).encode()
    if shape == "wrong_type":
        return json.dumps({"id": str(record_id), "payload": "x"}).encode()
    return json.dumps({"id": record_id, "payload": f"p{record_id}"}).encode()


# The reason code of each dead-letter shape.
DEAD_CODES = {"malformed": "malformed_json", "wrong_type": "wrong_type"}


def _produce(bootstrap: str, topic: str) -> tuple[dict[int, int], list[tuple[int, int, str]]]:
    """The records, half committed, an aborted transaction, the other half committed; returns the
    source partition of every id that must be a row, and each committed record that must be a dead
    letter as (partition, offset, reason code), sorted."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)
    rows: dict[int, int] = {}
    dead: list[tuple[int, int, str]] = []

    def dead_letter(code: str) -> Any:
        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            dead.append((msg.partition(), msg.offset(), code))

        return delivered

    for half, commit in ((0, True), (None, False), (1, True)):
        producer.begin_transaction()
        for partition in range(PARTITIONS):
            for n in range(PER_PARTITION // 2):
                number = n if half is None else half * (PER_PARTITION // 2) + n
                record_id = 1000 * partition + number + (500 if half is None else 0)
                shape = SHAPES[number % len(SHAPES)]
                code = DEAD_CODES.get(shape) if commit else None
                callback = {"on_delivery": dead_letter(code)} if code else {}
                producer.produce(topic, value=_value(record_id, shape), partition=partition, **callback)
                if commit and shape in ("good", "python_good"):
                    rows[record_id] = partition
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)
    assert len(dead) == 2 * PARTITIONS * (PER_PARTITION // len(SHAPES))  # every delivery reported
    return rows, sorted(dead)


@pytest.mark.parametrize("path", ["warm", "warm_jvm", "jvm", "python", "local", "shuffled"])
def test_each_source_partition_keeps_its_order_in_every_output(
    stack, settings, make_topic, tmp_path, monkeypatch, capfd, path
) -> None:
    out_topic = make_topic("ordered-out", partitions=2)
    monkeypatch.setenv("ONCEFLOW_TEST_OUT_TOPIC", out_topic)
    warm = path.startswith("warm")
    if not warm:
        monkeypatch.delenv("ONCEFLOW_SPARK_REMOTE", raising=False)
    if path == "jvm":
        monkeypatch.setenv("SPARK_CONF_DIR", str(spark_conf_with_kafka(tmp_path / "spark-conf")))
    monkeypatch.setenv("ONCEFLOW_JSON_READ", "jvm" if path.endswith("jvm") else "python")
    rows, dead = _produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"])
    logs: list[str] = []
    submit = runner.submit_slice

    def submit_and_keep_log(*args: Any, **kwargs: Any) -> Any:
        done = submit(*args, **kwargs)
        logs.append(done.stdout + done.stderr)  # spark-submit may hand the driver's stderr to stdout
        return done

    monkeypatch.setattr(runner, "submit_slice", submit_and_keep_log)
    name = {"local": "ORDERED_PLAIN", "shuffled": "ORDERED_SHUFFLED"}.get(path, "ORDERED")
    pipeline = f"tests.integration.engine.pipelines:{name}"
    executor = "connect" if warm else {"local": "local"}.get(path, "submit")
    outcome = runner.run_epoch(pipeline, Settings.from_env(), executor=executor)
    assert outcome.epoch.status == EpochStatus.COMMITTED

    if path != "local":
        rows = {i: p for i, p in rows.items() if i % 5 != 4}  # what the transform keeps
    out = kafka_records(settings.kafka_bootstrap, out_topic)
    assert sorted(int(value["id"]) for _, value in out) == sorted(rows)
    assert order_violations(out) == []
    files = read_committed_table(stack["ONCEFLOW_TEST_FILES"], "ordered")
    assert sorted(files.column("id").to_pylist()) == sorted(rows)
    assert files_order_violations(stack["ONCEFLOW_TEST_FILES"], "ordered") == []
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        letters = ledger.dead_letters(outcome.epoch.pipeline)
    # Each bad record is a dead letter at its own position with its own reason, once.
    assert sorted((d.letter.partition, d.letter.offset, d.letter.code) for d in letters) == dead
    if path != "local":  # the slice ran on the path it was meant to, in one Spark job
        if warm:  # the slice's driver is this process
            logs.append(capfd.readouterr().err)
        assert len(logs) == 1
        said = [line for line in logs[0].splitlines() if line.startswith("[onceflow process]")]
        read_path = "jvm" if path.endswith("jvm") else "python"
        assert any(f"{read_path} read path" in line for line in said), said
        if path == "shuffled":
            assert any("one job per sink: the transform's plan has Exchange" in line for line in said), said
        else:
            assert any("one pass over" in line for line in said), said
