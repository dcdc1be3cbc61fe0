"""`make demo`: a first round trip through the local stack.

Kafka (transactions, one of them aborted) -> Airflow (`airflow dags test onceflow_smoke`) ->
spark-submit -> executors reading the exact offset range with read_committed -> a report that checks
every committed record arrived once and no aborted record did.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

from onceflow.config import Settings
from onceflow.local_airflow import airflow_environment, migrate, run_airflow
from onceflow.sources.kafka_metadata import KafkaMetadata

TOPIC = "onceflow-demo-smoke"
BATCHES = 10
BATCH_SIZE = 200
ABORTED_BATCH = 4


def _say(message: str) -> None:
    print(f"[onceflow demo] {message}", file=sys.stderr, flush=True)


def _ensure_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if TOPIC not in admin.list_topics(timeout=15).topics:
        _say(f"creating topic {TOPIC}")
        admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])[TOPIC].result(30)


def _end_offset(bootstrap: str) -> int:
    """The demo partition's last stable offset: where a read_committed reader's view ends."""
    with KafkaMetadata(bootstrap) as metadata:
        return metadata.partitions([TOPIC])[0].stable


def _produce(bootstrap: str, run: str) -> tuple[int, list[str]]:
    """Append this run's batches; return the start offset and the values that were committed."""
    from confluent_kafka import Producer

    start = _end_offset(bootstrap)

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"onceflow-demo-{run}"})
    producer.init_transactions(30)
    committed: list[str] = []
    for batch in range(BATCHES):
        values = [f"{run}:{batch}:{i}" for i in range(BATCH_SIZE)]
        producer.begin_transaction()
        for value in values:
            producer.produce(TOPIC, value=value.encode())
        producer.flush(30)
        if batch == ABORTED_BATCH:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed.extend(values)
    _say(
        f"produced {BATCHES} transactions of {BATCH_SIZE} records to {TOPIC} from offset {start} "
        f"(transaction {ABORTED_BATCH} aborted)"
    )
    return start, committed


def main() -> int:
    settings = Settings.from_env()
    root = Path(__file__).resolve().parents[2]
    run = time.strftime("%Y%m%dT%H%M%S")
    _ensure_topic(settings.kafka_bootstrap)
    start, committed = _produce(settings.kafka_bootstrap, run)

    until = _end_offset(settings.kafka_bootstrap)

    airflow_home = settings.home / "airflow"
    env = airflow_environment(settings, root, airflow_home)
    _say(f"preparing Airflow in {airflow_home}")
    migrate(env)
    output = settings.home / "demo" / f"smoke-{run}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    conf = {"topic": TOPIC, "partition": 0, "from_offset": start, "until_offset": until}
    conf["output"] = str(output)
    _say(f"airflow dags test onceflow_smoke: Spark reads {TOPIC}[0] offsets [{start}, {until})")
    began = time.monotonic()
    run_airflow(["dags", "test", "onceflow_smoke", "--conf", json.dumps(conf)], env)
    elapsed = time.monotonic() - began

    read = [value for _, value in json.loads(output.read_text())["records"]]
    counts = Counter(read)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    missing = len(set(committed) - set(counts))
    aborted_seen = sum(1 for value in counts if value.split(":")[1] == str(ABORTED_BATCH))
    print(
        "\n".join(
            [
                "onceflow demo report",
                f"  offsets read          [{start}, {until}) of {TOPIC}[0]",
                f"  records committed in  {len(committed)}",
                f"  records read out      {len(read)}",
                f"  duplicates            {duplicates}",
                f"  missing               {missing}",
                f"  aborted records seen  {aborted_seen}",
                f"  airflow + spark time  {elapsed:.1f}s",
                "",
                "Open the Airflow UI on the same DAGs and data with:  make airflow-ui",
            ]
        )
    )
    ok = duplicates == 0 and missing == 0 and aborted_seen == 0 and len(read) == len(committed)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
