"""Freshness through `onceflow run --follow`: a batch of records produced → committed in the sink.

One follower (`onceflow.engine.follow.follow`, in a thread of this process, on the warm runtime) runs the
bench's files pipeline; batches of ``per_batch`` records are produced a few seconds apart, and each
batch's freshness is the time from the producer's flush to the ledger showing the epoch that read its
last record COMMITTED, which is when the files sink has made its rows visible. The epochs' own
durations come from the follower's progress lines. The first batch warms the session up and is left out.
"""

from __future__ import annotations

import re
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.dataset import PARTITIONS, create_topic, delete_topics, record
from onceflow.config import Settings
from onceflow.engine.follow import follow
from onceflow.ledger import Ledger
from onceflow.pipeline import load_pipeline

EPOCH_SECONDS = re.compile(r": (\d+) offsets in ([\d.]+) s")
STEP_SECONDS = re.compile(r"(plan|process|commit) ([\d.]+) s")


def produce_batch(bootstrap: str, topic: str, first: int, count: int) -> None:
    """Records ``first`` to ``first + count - 1`` of the bench's data set, spread over its partitions."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(first, first + count):
        producer.produce(topic, value=record(i), key=str(i).encode(), partition=i % PARTITIONS)
    if producer.flush(60) != 0:
        raise RuntimeError(f"producing to {topic}: records left undelivered")


def _committed(ledger: Ledger, pipeline: str) -> int:
    return sum(ledger.committed_offsets(pipeline).values())


def measure(
    settings: Settings, workdir: Path, *, batches: int = 15, per_batch: int = 1000, gap_s: float = 2.0
) -> dict[str, Any]:
    """Freshness and epoch seconds of ``batches`` batches through one follower on the warm runtime."""
    from bench import sinks_check

    uid = uuid.uuid4().hex[:8]
    name, module = f"bench-follow-{uid}", f"bench_follow_{uid}"
    topic = create_topic(settings.kafka_bootstrap, "bench-follow")
    (workdir / f"{module}.py").write_text(
        "from pathlib import Path\n\nfrom bench.pipelines import bench_pipeline\n\n"
        f"SPEC = bench_pipeline('files', {name!r}, {topic!r}, Path({str(workdir)!r}), "
        "batch_per_partition=100_000)\n"
    )
    sys.path.insert(0, str(workdir))
    lines: list[str] = []
    stop = threading.Event()
    runner = threading.Thread(
        target=follow,
        args=(f"{module}:SPEC", settings),
        kwargs={"executor": "connect", "poll_s": 0.05, "stop": stop, "progress": lines.append},
        daemon=True,
    )
    freshness: list[float] = []
    try:
        runner.start()
        with Ledger.connect(settings.ledger_url) as ledger:
            for batch in range(batches + 1):
                produce_batch(settings.kafka_bootstrap, topic, batch * per_batch, per_batch)
                produced = time.perf_counter()
                deadline = produced + 120
                while _committed(ledger, name) < (batch + 1) * per_batch:
                    if time.perf_counter() > deadline or not runner.is_alive():
                        raise RuntimeError(f"{name}: batch {batch} not committed in 120 s: {lines[-3:]}")
                    time.sleep(0.01)
                if batch:  # the first one opened the session and shipped the modules
                    freshness.append(time.perf_counter() - produced)
                time.sleep(gap_s)
    finally:
        stop.set()
        runner.join(120)
        sys.path.remove(str(workdir))
        sinks_check.drop_output(load_pipeline(f"{module}:SPEC"), settings)
        delete_topics(settings.kafka_bootstrap, [topic])
    epochs = [(int(m.group(1)), float(m.group(2))) for line in lines if (m := EPOCH_SECONDS.search(line))]
    later = [seconds for records, seconds in epochs[1:] if records]
    # Where an epoch's time goes, per step, over the same epochs.
    steps: dict[str, list[float]] = {}
    for line in [line for line in lines if EPOCH_SECONDS.search(line)][1:]:
        for step, seconds in STEP_SECONDS.findall(line):
            steps.setdefault(step, []).append(float(seconds))
    return {
        "records_per_batch": per_batch,
        "batches": batches,
        "poll_s": 0.05,
        "freshness_s": [round(s, 3) for s in freshness],
        "freshness_median_s": round(statistics.median(freshness), 3),
        "epoch_s": later,
        "epoch_median_s": round(statistics.median(later), 3) if later else None,
        "step_median_s": {step: round(statistics.median(v), 3) for step, v in steps.items()},
        "epochs": len(epochs),
    }
