"""The ``onceflow`` command: ledger maintenance and the manual operations the invariants allow.

Commands read the ledger URL from ``--ledger-url`` or ONCEFLOW_LEDGER_URL. ``recover``, ``commit`` and
``abort`` need committers for the pipeline's sinks, found through `onceflow.ledger.committers` (set
ONCEFLOW_COMMITTER_PROVIDER=package.module:callable, or register one in code before calling `main`).

Exit status: 0 done (also when there was nothing to do), 1 error, 2 bad usage, 3 refused because the
protocol's invariants forbid it (e.g. aborting an epoch that is already COMMITTING).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from onceflow.config import Settings
from onceflow.errors import OnceflowError

if TYPE_CHECKING:
    from onceflow.ledger import Epoch, Ledger
    from onceflow.pipeline import Pipeline
    from onceflow.sinks.base import SinkCommitter

EXIT_ERROR = 1
EXIT_REFUSED = 3
KAFKA_TIMEOUT_S = 3.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onceflow", description=__doc__.splitlines()[0])
    parser.add_argument("--ledger-url", help="SQLAlchemy URL of the ledger (default: ONCEFLOW_LEDGER_URL)")
    sub = parser.add_subparsers(dest="command", required=True)

    db = sub.add_parser("db", help="ledger database maintenance")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("upgrade", help="create or migrate the ledger schema to this version of onceflow")

    epochs = sub.add_parser("epochs", help="list a pipeline's epochs")
    epochs.add_argument("pipeline")
    epochs.add_argument("--last", type=int, default=None, help="only the last N epochs")
    epochs.add_argument("--json", action="store_true", help="machine-readable output")

    status = sub.add_parser("status", help="committed position, epoch in flight and lag of a pipeline")
    status.add_argument("pipeline")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--kafka-timeout", type=float, default=KAFKA_TIMEOUT_S, help="seconds (default 3)")

    recover = sub.add_parser("recover", help="finish or roll back the epoch in flight, sweep orphans")
    recover.add_argument("pipeline")
    recover.add_argument("--json", action="store_true", help="machine-readable output")

    preview = sub.add_parser("preview", help="print the next epoch's ranges; changes nothing (a dry run)")
    preview.add_argument("pipeline")
    preview.add_argument("--max-records-per-partition", type=int, default=None)

    commit = sub.add_parser("commit", help="commit an epoch (allowed once every participant pre-committed)")
    commit.add_argument("pipeline")
    commit.add_argument("epoch", type=int)

    abort = sub.add_parser("abort", help="abort an epoch (allowed until it is COMMITTING)")
    abort.add_argument("pipeline")
    abort.add_argument("epoch", type=int)
    abort.add_argument("--reason", default="aborted by hand with `onceflow abort`")
    return parser


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds")


def _epoch_dict(ledger: Ledger, epoch: Epoch) -> dict[str, Any]:
    participants = ledger.participants(epoch.pipeline, epoch.number)
    return {
        "epoch": epoch.number,
        "status": str(epoch.status),
        "run_id": epoch.run_id,
        "ranges": [
            {"topic": r.topic, "partition": r.partition, "from": r.from_offset, "until": r.until_offset}
            for r in epoch.ranges
        ],
        "expected_participants": len(epoch.expected),
        "participants": [
            {
                "sink": p.sink,
                "task": p.task,
                "attempt": p.attempt,
                "status": str(p.status),
                "records": p.record_count,
                "staged": p.staged_location,
            }
            for p in participants
        ],
        "data_interval": [_time(epoch.data_interval_start), _time(epoch.data_interval_end)],
        "planned_at": _time(epoch.planned_at),
        "decided_at": _time(epoch.decided_at),
        "finished_at": _time(epoch.finished_at),
        "abort_reason": epoch.abort_reason,
    }


def _cmd_epochs(ledger: Ledger, args: argparse.Namespace) -> int:
    rows = [_epoch_dict(ledger, e) for e in ledger.epochs(args.pipeline, last=args.last)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"pipeline {args.pipeline!r} has no epochs")
        return 0
    for row in rows:
        ranges = " ".join(f"{r['topic']}[{r['partition']}]@[{r['from']},{r['until']})" for r in row["ranges"])
        done = sum(p["status"] != "ABORTED" for p in row["participants"])
        times = " ".join(
            f"{key}={row[key + '_at']}" for key in ("planned", "decided", "finished") if row[key + "_at"]
        )
        reason = f" reason={row['abort_reason']!r}" if row["abort_reason"] else ""
        print(
            f"{row['epoch']:>6} {row['status']:<10} participants {done}/{row['expected_participants']} "
            f"{ranges or '(no input)'} {times}{reason}"
        )
    return 0


def _high_watermarks(bootstrap: str, partitions: Sequence[tuple[str, int]], timeout: float) -> dict[Any, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "onceflow-cli-status",
            "enable.auto.commit": False,
            "socket.timeout.ms": int(timeout * 1000),
            "log_level": 0,
        }
    )
    try:
        return {
            (topic, part): int(
                consumer.get_watermark_offsets(TopicPartition(topic, part), timeout=timeout)[1]
            )
            for topic, part in partitions
        }
    finally:
        consumer.close()


def _cmd_status(ledger: Ledger, args: argparse.Namespace, settings: Settings | None) -> int:
    committed = ledger.committed_offsets(args.pipeline)
    in_flight = ledger.open_epoch(args.pipeline)
    kafka = "ok"
    high: dict[Any, int] = {}
    if committed:
        try:
            bootstrap = (settings or Settings.from_env()).kafka_bootstrap
            high = _high_watermarks(bootstrap, sorted(committed), args.kafka_timeout)
        except Exception as exc:  # any failure to reach Kafka only costs the lag column
            kafka = f"Kafka unreachable ({exc})"
    positions = [
        {
            "topic": topic,
            "partition": part,
            "committed": offset,
            "high_watermark": high.get((topic, part)),
            "lag": None if (topic, part) not in high else max(high[(topic, part)] - offset, 0),
        }
        for (topic, part), offset in sorted(committed.items())
    ]
    result = {
        "pipeline": args.pipeline,
        "positions": positions,
        "in_flight": None if in_flight is None else _epoch_dict(ledger, in_flight),
        "kafka": kafka,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"pipeline {args.pipeline!r}")
    if not positions:
        print("  nothing committed yet")
    for p in positions:
        lag = "lag ?" if p["lag"] is None else f"lag {p['lag']}"
        print(f"  {p['topic']}[{p['partition']}] committed {p['committed']} {lag}")
    if kafka != "ok":
        print(f"  {kafka}")
    if in_flight is None:
        print("  no epoch in flight")
    else:
        print(f"  in flight: epoch {in_flight.number} {in_flight.status} since {_time(in_flight.planned_at)}")
    return 0


def _committers(pipeline: str, sinks: Sequence[str]) -> dict[str, SinkCommitter]:
    from onceflow.engine.sinks import PIPELINES_ENV, pipeline_committer
    from onceflow.ledger.committers import ENV_VAR, committer_provider, committers_for

    if os.environ.get(PIPELINES_ENV) and not os.environ.get(ENV_VAR):
        return committers_for(pipeline_committer, pipeline, sinks)
    return committers_for(committer_provider(), pipeline, sinks)


def _cmd_recover(ledger: Ledger, args: argparse.Namespace) -> int:
    report = ledger.recover(args.pipeline, _committers(args.pipeline, ledger.sinks(args.pipeline)))
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.summary())
    return 0


def _spec(pipeline: str) -> Pipeline:
    from onceflow.engine.sinks import PIPELINES_ENV
    from onceflow.errors import ConfigError
    from onceflow.pipeline import load_pipeline

    paths = [p.strip() for p in os.environ.get(PIPELINES_ENV, "").split(",") if p.strip()]
    for path in paths:
        spec = load_pipeline(path)
        if spec.name == pipeline:
            return spec
    raise ConfigError(f"pipeline {pipeline!r} is not among the specs in {PIPELINES_ENV}={','.join(paths)!r}")


def _cmd_preview(ledger: Ledger, args: argparse.Namespace, settings: Settings | None) -> int:
    from onceflow.engine.steps import describe_slices, preview

    plan, slices = preview(
        _spec(args.pipeline),
        ledger,
        settings or Settings.from_env(),
        max_records_per_partition=args.max_records_per_partition,
    )
    print(
        f"the next epoch of {args.pipeline!r} would read {plan.span} offsets in {len(plan.ranges)} partitions"
    )
    print("\n".join(describe_slices(plan, slices)))
    return 0


def _cmd_commit(ledger: Ledger, args: argparse.Namespace) -> int:
    epoch = ledger.epoch(args.pipeline, args.epoch)
    done = ledger.commit_epoch(args.pipeline, args.epoch, _committers(args.pipeline, epoch.sinks))
    print(f"{done}")
    return 0


def _cmd_abort(ledger: Ledger, args: argparse.Namespace) -> int:
    sinks = sorted({p.sink for p in ledger.participants(args.pipeline, args.epoch)})
    done = ledger.abort_epoch(args.pipeline, args.epoch, _committers(args.pipeline, sinks), args.reason)
    print(f"{done}")
    return 0


def run(args: argparse.Namespace) -> int:
    from onceflow.ledger import Ledger

    settings = None
    url = args.ledger_url
    if url is None:
        settings = Settings.from_env()
        url = settings.ledger_url
    if args.command == "db":
        with Ledger.connect(url, check=False) as ledger:
            ledger.upgrade()
            print(f"ledger at {ledger.url} is at the current schema")
        return 0
    with Ledger.connect(url) as ledger:
        if args.command == "epochs":
            return _cmd_epochs(ledger, args)
        if args.command == "status":
            return _cmd_status(ledger, args, settings)
        if args.command == "preview":
            return _cmd_preview(ledger, args, settings)
        if args.command == "recover":
            return _cmd_recover(ledger, args)
        if args.command == "commit":
            return _cmd_commit(ledger, args)
        return _cmd_abort(ledger, args)


def main(argv: Sequence[str] | None = None) -> int:
    from onceflow.ledger.errors import IllegalTransition, PrecommitRefused

    args = _parser().parse_args(argv)
    try:
        return run(args)
    except (IllegalTransition, PrecommitRefused) as exc:
        print(f"onceflow: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OnceflowError as exc:
        print(f"onceflow: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
