"""The ``onceflow`` command: run epochs, inspect them, and the manual operations the invariants allow.

Commands read the ledger URL from ``--ledger-url`` or ONCEFLOW_LEDGER_URL. ``run``, ``recover``,
``preview``, ``commit`` and ``abort`` need the pipeline's spec, found by name among the specs listed in
ONCEFLOW_PIPELINES (``module:attribute,...``). Every one of them goes through the same `Coordinator` as
the Airflow tasks, so a refusal reads the same whichever door was used.

Exit status: 0 done (also when there was nothing to do), 1 error, 2 bad usage, 3 refused because the
protocol's invariants forbid it (e.g. aborting an epoch that is already COMMITTING), 130 interrupted.
Every failure is one line on stderr; ``--debug`` (or ONCEFLOW_DEBUG=1) adds the traceback and the Kafka
client's own log lines.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import sys
import traceback
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from onceflow import redact
from onceflow.cli import topics
from onceflow.config import EXECUTORS, Settings
from onceflow.console.actions import refusal_line
from onceflow.console.read_model import backlog as _backlog
from onceflow.console.read_model import epoch_dict as _epoch_dict
from onceflow.console.read_model import iso_time as _time
from onceflow.errors import ConfigError, OnceflowError, debug_enabled, one_line
from onceflow.monitoring import dead_letters
from onceflow.sources.kafka_clients import LOGGER_NAME

if TYPE_CHECKING:
    from onceflow.ledger import Ledger
    from onceflow.protocol.coordinator import Coordinator

EXIT_ERROR = 1
EXIT_REFUSED = 3
EXIT_INTERRUPTED = 130
KAFKA_TIMEOUT_S = 3.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onceflow", description=__doc__.splitlines()[0])
    parser.add_argument("--ledger-url", help="SQLAlchemy URL of the ledger (default: ONCEFLOW_LEDGER_URL)")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="tracebacks and Kafka client logs (or ONCEFLOW_DEBUG=1)",
    )
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
    recover.add_argument(
        "--force", action="store_true", help="also roll back an undecided epoch whose owner is still alive"
    )

    run = sub.add_parser("run", help="run epochs without Airflow: recover, plan, process, commit")
    run.add_argument("pipeline")
    run.add_argument("--until-caught-up", action="store_true", help="run epochs until nothing new is left")
    run.add_argument(
        "--follow",
        action="store_true",
        help="keep running: the next epoch as soon as new records arrive, until SIGTERM or Ctrl-C "
        "(the epoch in flight commits first)",
    )
    run.add_argument(
        "--poll", type=float, default=0.2, help="with --follow: seconds between looks for new records"
    )
    run.add_argument("--max-records-per-partition", type=int, default=None)
    run.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=None,
        help="spark: the Spark Connect server in ONCEFLOW_SPARK_REMOTE if set, else spark-submit; "
        "connect or submit: only that one; local: no Spark, no transform (default: ONCEFLOW_EXECUTOR, "
        "else spark)",
    )

    preview = sub.add_parser("preview", help="print the next epoch's ranges; changes nothing (a dry run)")
    preview.add_argument("pipeline")
    preview.add_argument("--max-records-per-partition", type=int, default=None)

    commit = sub.add_parser("commit", help="commit an epoch (allowed once every participant pre-committed)")
    commit.add_argument("pipeline")
    commit.add_argument("epoch", type=int)

    abort = sub.add_parser("abort", help="abort an epoch (allowed until it is COMMITTING)")
    abort.add_argument("pipeline")
    abort.add_argument("epoch", type=int)
    abort.add_argument("--reason", default=None, help="recorded as the abort reason (default: who aborted)")

    retain = sub.add_parser("retain", help="delete ledger history no step needs: old epochs, dead letters")
    retain.add_argument("pipeline")
    retain.add_argument(
        "--keep-epochs", type=int, default=None, help="committed epochs kept (ONCEFLOW_RETAIN_EPOCHS)"
    )
    retain.add_argument(
        "--dead-letter-days",
        type=float,
        default=None,
        help="dead letters older than this are deleted (default: ONCEFLOW_DEAD_LETTER_DAYS)",
    )

    dead_letters.add_parser(sub)
    topics.add_parser(sub)
    return parser


def _cmd_epochs(ledger: Ledger, args: argparse.Namespace, settings: Settings) -> int:
    from onceflow.catalog import known_pipeline

    known_pipeline(ledger, args.pipeline, settings.pipelines)
    rows = [_epoch_dict(ledger, e) for e in ledger.epochs(args.pipeline, last=args.last)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"pipeline {args.pipeline!r} has no epochs")
        return 0
    for row in rows:
        ranges = " ".join(f"{r['topic']}[{r['partition']}]@[{r['from']},{r['until']})" for r in row["ranges"])
        done = len(row["participants"])  # registered pre-commits, whatever became of them since
        times = " ".join(
            f"{key}={row[key + '_at']}" for key in ("planned", "decided", "finished") if row[key + "_at"]
        )
        reason = f" reason={row['abort_reason']!r}" if row["abort_reason"] else ""
        print(
            f"{row['epoch']:>6} {row['status']:<10} pre-committed {done}/{row['expected_participants']} "
            f"{ranges or '(no input)'} {times}{reason}"
        )
    return 0


def _cmd_status(ledger: Ledger, args: argparse.Namespace, settings: Settings) -> int:
    from onceflow.catalog import known_pipeline

    spec = known_pipeline(ledger, args.pipeline, settings.pipelines)
    committed = ledger.committed_offsets(args.pipeline)
    in_flight = ledger.open_epoch(args.pipeline)
    bootstrap = settings.kafka_bootstrap
    kafka = "ok"
    backlog: dict[Any, Any] = {}
    if committed or spec is not None:
        try:
            backlog = _backlog(spec, committed, bootstrap, args.kafka_timeout)
        except OnceflowError as exc:  # Kafka out of reach only costs the lag column
            kafka = f"lag unknown: {exc}"
    group, in_group = _group_positions(args.pipeline, committed, bootstrap, kafka == "ok", args.kafka_timeout)
    keys = sorted({*committed, *backlog})
    positions = [
        {
            "topic": topic,
            "partition": part,
            "committed": committed.get((topic, part)),
            "last_stable_offset": backlog[(topic, part)][1] if (topic, part) in backlog else None,
            "lag": backlog[(topic, part)][1] - backlog[(topic, part)][0]
            if (topic, part) in backlog
            else None,
            "group_offset": in_group.get((topic, part)),
        }
        for topic, part in keys
    ]
    behind = [p for p in positions if p["committed"] is not None and p["group_offset"] != p["committed"]]
    result = {
        "pipeline": args.pipeline,
        "positions": positions,
        "in_flight": None if in_flight is None else _epoch_dict(ledger, in_flight),
        "kafka": kafka,
        "consumer_group": group,
        "group_matches_ledger": None if not in_group else not behind,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"pipeline {args.pipeline!r}")
    if not committed:
        print("  nothing committed yet")
    for p in positions:
        lag = "lag ?" if p["lag"] is None else f"lag {p['lag']}"
        where = "not started" if p["committed"] is None else f"committed {p['committed']}"
        print(f"  {p['topic']}[{p['partition']}] {where} {lag}")
    if kafka != "ok":
        print(f"  {kafka}")
    if in_group and behind:
        where = ", ".join(f"{p['topic']}[{p['partition']}] at {p['group_offset']}" for p in behind)
        print(
            f"  consumer group {group!r} differs from the ledger ({where}); the ledger holds the position "
            "and the next committed epoch writes the group again"
        )
    if in_flight is None:
        print("  no epoch in flight")
    else:
        print(f"  in flight: epoch {in_flight.number} {in_flight.status} since {_time(in_flight.planned_at)}")
    return 0


def _group_positions(
    pipeline: str, committed: dict[Any, int], bootstrap: str, reachable: bool, timeout: float
) -> tuple[str, dict[Any, int | None]]:
    """The position group's offsets of the committed partitions (empty when Kafka is out of reach)."""
    from onceflow.sources.consumer_group import group_positions, position_group

    group = position_group(pipeline)
    if not committed or not reachable:
        return group, {}
    try:
        return group, group_positions(bootstrap, group, committed, timeout_s=timeout)
    except Exception:  # the group is a copy for Kafka's tools; status still shows the ledger's truth
        return group, {}


def _coordinator(ledger: Ledger, pipeline: str, settings: Settings) -> Coordinator:
    from onceflow.catalog import find_pipeline
    from onceflow.protocol.coordinator import Coordinator

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    return Coordinator.for_pipeline(find_pipeline(pipeline, settings.pipelines), ledger, settings, log=say)


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name in the environment nor in the password database
        user = ""
    return f"`onceflow` by {user or 'an operator'}"


def _cmd_recover(ledger: Ledger, args: argparse.Namespace, settings: Settings) -> int:
    coordinator = _coordinator(ledger, args.pipeline, settings)
    report = coordinator.recover(by=f"{_who()} (recover{' --force' if args.force else ''})", force=args.force)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.summary())
    return 0


def _cmd_preview(ledger: Ledger, args: argparse.Namespace, settings: Settings) -> int:
    from onceflow.protocol.planning import describe_slices

    plan, slices = _coordinator(ledger, args.pipeline, settings).preview(
        max_records_per_partition=args.max_records_per_partition
    )
    print(
        f"the next epoch of {args.pipeline!r} would read {plan.span} offsets in {len(plan.ranges)} partitions"
    )
    print("\n".join(describe_slices(plan, slices)))
    return 0


def _cmd_commit(ledger: Ledger, args: argparse.Namespace, settings: Settings) -> int:
    done = _coordinator(ledger, args.pipeline, settings).commit(number=args.epoch)
    print(f"{done}")
    return 0


def _cmd_abort(ledger: Ledger, args: argparse.Namespace, settings: Settings) -> int:
    reason = args.reason or f"aborted by hand with {_who()}"
    done = _coordinator(ledger, args.pipeline, settings).abort(number=args.epoch, reason=reason)
    print(f"{done}")
    return 0


def _cmd_retain(ledger: Ledger, args: argparse.Namespace, settings: Settings) -> int:
    from onceflow.catalog import known_pipeline
    from onceflow.protocol.coordinator import Coordinator

    known_pipeline(ledger, args.pipeline, settings.pipelines)
    base = settings
    if args.keep_epochs is not None and args.keep_epochs < 1:
        raise ConfigError(f"--keep-epochs {args.keep_epochs}: keep at least the last committed epoch (>= 1)")
    if args.keep_epochs is None and base.retain_epochs == 0:
        raise ConfigError(
            "retention is off (ONCEFLOW_RETAIN_EPOCHS=0): say how many epochs to keep, --keep-epochs N"
        )
    coordinator = Coordinator(ledger, args.pipeline, {}, settings=base)
    result = coordinator.retain(keep_epochs=args.keep_epochs, dead_letter_days=args.dead_letter_days)
    print("\n".join(result.lines()))
    return 0


def _cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from onceflow.catalog import find_pipeline_path
    from onceflow.engine.runner import run_until

    path, _ = find_pipeline_path(args.pipeline, settings.pipelines)
    if args.follow:
        if args.until_caught_up:
            raise ConfigError("--follow and --until-caught-up exclude each other")
        if not args.poll > 0:
            raise ConfigError(f"--poll must be a positive number of seconds, not {args.poll:g}")
        from onceflow.engine.follow import follow

        follow(
            path,
            settings,
            executor=args.executor,
            max_records_per_partition=args.max_records_per_partition,
            poll_s=args.poll,
            progress=print,
        )
        return 0
    run_until(
        path,
        settings,
        until_caught_up=args.until_caught_up,
        max_records_per_partition=args.max_records_per_partition,
        executor=args.executor,
        progress=print,
    )
    return 0


def run(args: argparse.Namespace) -> int:
    from onceflow.ledger import Ledger

    # The door: every command gets the deployment's settings here, the ledger URL of --ledger-url first.
    settings = Settings.from_env()
    if args.ledger_url is not None:
        settings = replace(settings, ledger_url=args.ledger_url)
    url = settings.ledger_url
    if args.command == "db":
        with Ledger.connect(url, check=False) as ledger:
            ledger.upgrade()
            print(f"ledger at {ledger.url} is at the current schema")
        return 0
    if args.command == "run":
        return _cmd_run(args, settings)
    if args.command == "topics":
        return topics.run(args, settings)
    with Ledger.connect(url) as ledger:
        if args.command == "dead-letters":
            return dead_letters.run(ledger, args, settings.pipelines)
        if args.command == "epochs":
            return _cmd_epochs(ledger, args, settings)
        if args.command == "status":
            return _cmd_status(ledger, args, settings)
        commands = {
            "preview": _cmd_preview,
            "recover": _cmd_recover,
            "commit": _cmd_commit,
            "retain": _cmd_retain,
        }
        return commands.get(args.command, _cmd_abort)(ledger, args, settings)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure is one line on stderr (a traceback only with --debug)."""
    from onceflow.ledger.errors import IllegalTransition, PrecommitRefused

    args = _parser().parse_args(argv)
    debug = args.debug or debug_enabled()
    if debug:
        handler = logging.StreamHandler()  # libraries' lines may quote a URL: through redact too
        handler.setFormatter(redact.Formatter("%(levelname)s %(name)s: %(message)s"))
        logging.basicConfig(level=logging.INFO, handlers=[handler])
        logging.getLogger(LOGGER_NAME).setLevel(logging.DEBUG)
    try:
        return run(args)
    except (IllegalTransition, PrecommitRefused) as exc:
        return _fail(refusal_line(exc), EXIT_REFUSED, debug)
    except OnceflowError as exc:
        return _fail(f"error: {one_line(exc)}", EXIT_ERROR, debug)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED, debug)
    except Exception as exc:  # not raised on purpose: still one line, with the way to the traceback
        hint = "" if debug else " (run with --debug for the traceback)"
        return _fail(f"error: unexpected {type(exc).__name__}: {one_line(exc)}{hint}", EXIT_ERROR, debug)


def _fail(line: str, code: int, debug: bool) -> int:
    if debug:  # the traceback quotes the messages of every cause, a driver's among them
        print(redact.text(traceback.format_exc()), end="", file=sys.stderr)
    print(f"onceflow: {redact.text(line)}", file=sys.stderr)  # a library's message may quote a URL
    return code


if __name__ == "__main__":
    sys.exit(main())
