"""The quix-streams peer (runs in its own virtualenv, see `bench.peers.quix`): the benchmark's filter and
projection with ``processing_guarantee="exactly-once"``, output to a Kafka topic in Kafka transactions.

Prints one JSON line: {"processing_s": seconds from run() to its return, "outputs": expected outputs}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def main() -> None:
    from quixstreams import Application

    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--outputs", type=int, required=True, help="stop after this many outputs")
    parser.add_argument("--min-amount", type=float, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state_dir:
        app = Application(
            broker_address=args.bootstrap,
            consumer_group=args.group,
            auto_offset_reset="earliest",
            processing_guarantee="exactly-once",
            state_dir=state_dir,
            loglevel="WARNING",
        )
        source = app.topic(args.topic, value_deserializer="json")
        sink = app.topic(args.output_topic, value_serializer="json")
        sdf = app.dataframe(source)
        sdf = sdf.filter(lambda v: v["amount"] >= args.min_amount)
        sdf = sdf.apply(lambda v: {"id": v["id"], "amount": v["amount"], "customer": v["customer"]})
        sdf.to_topic(sink)
        started = time.perf_counter()
        app.run(count=args.outputs, timeout=20, collect=False)
        elapsed = time.perf_counter() - started
    print(json.dumps({"processing_s": elapsed, "outputs": args.outputs}))


if __name__ == "__main__":
    main()
