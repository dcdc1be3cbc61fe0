"""One step of a fault scenario in its own process, so that a crash point can SIGKILL it for real.

    python -m tests.faults.driver epoch PIPELINE [--executor local|submit] [--max-records N]
    python -m tests.faults.driver socket-epoch PIPELINE --feed HOST:PORT --count N
    python -m tests.faults.driver recover PIPELINE
    python -m tests.faults.driver abort PIPELINE

Prints one JSON line describing the outcome. Exit 0: done; 1: the epoch failed and was aborted; 2: an
error; -9 (SIGKILL): a crash point fired.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

from onceflow.config import Settings
from onceflow.engine.runner import ProcessFailed, run_epoch
from onceflow.engine.slice_job import precommit_slice
from onceflow.errors import OnceflowError
from onceflow.executor.slices import SliceRef
from onceflow.executor.writing import write_task
from onceflow.faults import crash_point
from onceflow.ledger import Ledger
from onceflow.offsets import OffsetRange
from onceflow.pipeline import load_pipeline
from onceflow.protocol.coordinator import Coordinator
from tests.faults.pipelines import SOCKET_TOPIC
from tests.faults.socket_feed import read_feed


def epoch(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    outcome = run_epoch(
        args.pipeline, settings, executor=args.executor, max_records_per_partition=args.max_records
    )
    return {
        "epoch": outcome.epoch.number,
        "status": str(outcome.epoch.status),
        "span": sum(r.span for r in outcome.epoch.ranges),
        "steps": {step: round(seconds, 2) for step, seconds in outcome.steps.items()},
    }


def socket_epoch(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """recover -> plan -> read from the feed -> stage in every sink -> commit, for a non-replayable source.

    The plan records the positions the epoch consumes; a replay plans them again but can only read what
    the feed still has, which is how a socket source loses a crashed epoch's records.
    """
    spec = load_pipeline(args.pipeline)
    with Ledger.connect(settings.ledger_url) as ledger:
        coordinator = Coordinator.for_pipeline(spec, ledger, settings)
        coordinator.recover(by="fault harness")
        position = ledger.committed_offsets(spec.name).get((SOCKET_TOPIC, 0), 0)
        ranges = (OffsetRange(SOCKET_TOPIC, 0, position, position + args.count),)
        planned = ledger.plan_epoch(spec.name, ranges, [(sink.name, "s0-t0") for sink in spec.sinks])
        crash_point("after_plan")
        rows = [{"id": r["id"], "payload": r["payload"]} for r in read_feed(args.feed, args.count)]
        ref = SliceRef(spec, planned.number, 0, ranges, settings.kafka_bootstrap, settings=settings)
        attempt = f"socket-{uuid.uuid4().hex[:12]}"
        reports = [write_task(ref, sink, "s0-t0", attempt, iter(rows)) for sink in spec.sinks]
        precommit_slice(coordinator, 0, planned, planned.attempt_token, reports, [], ["s0-t0"])
        done = coordinator.commit(number=planned.number)
    assert done is not None
    return {"epoch": done.number, "status": str(done.status), "span": len(rows)}


def abort(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """Abort the epoch in flight, as `onceflow abort` or a cleared abort task does."""
    spec = load_pipeline(args.pipeline)
    with Ledger.connect(settings.ledger_url) as ledger:
        in_flight = ledger.open_epoch(spec.name)
        if in_flight is None:
            return {"aborted": None}
        done = Coordinator.for_pipeline(spec, ledger, settings).abort(
            number=in_flight.number, reason="aborted by the fault harness"
        )
    assert done is not None
    return {"aborted": done.number, "status": str(done.status)}


def recover(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    spec = load_pipeline(args.pipeline)
    with Ledger.connect(settings.ledger_url) as ledger:
        report = Coordinator.for_pipeline(spec, ledger, settings).recover(by="fault harness")
    return {"recovered": report.summary()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.driver")
    sub = parser.add_subparsers(dest="step", required=True)
    run = sub.add_parser("epoch")
    run.add_argument("pipeline")
    run.add_argument("--executor", choices=("local", "submit", "connect"), default="local")
    run.add_argument("--max-records", type=int, default=None)
    sock = sub.add_parser("socket-epoch")
    sock.add_argument("pipeline")
    sock.add_argument("--feed", required=True)
    sock.add_argument("--count", type=int, required=True)
    for name in ("recover", "abort"):
        sub.add_parser(name).add_argument("pipeline")
    args = parser.parse_args(argv)
    steps = {"epoch": epoch, "socket-epoch": socket_epoch, "recover": recover, "abort": abort}
    try:
        print(json.dumps(steps[args.step](args, Settings.from_env())), flush=True)
    except ProcessFailed as exc:
        print(json.dumps({"failed": str(exc)[:2000]}), flush=True)
        return 1
    except OnceflowError as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:2000]}), flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
