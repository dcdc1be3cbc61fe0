"""``onceflow topics create``: make the Kafka topic a new pipeline reads (or a Kafka sink writes).

A pipeline plans its ranges from the partitions a topic has, so its input topic must exist before the
first run; this saves reaching for Kafka's own scripts. Creating a topic that already exists with the
requested partitions is "nothing to do", as every onceflow command treats a repeated request; with
another partition count it is an error, because onceflow never changes a topic's partitions.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from onceflow.config import Settings
from onceflow.errors import ConfigError, OnceflowError, ServiceUnavailable
from onceflow.sources.kafka_clients import kafka_config, kafka_error_text

TIMEOUT_S = 30.0
# What Kafka accepts as a topic name (and what a pipeline's source accepts).
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def add_parser(sub: Any) -> None:
    """The ``topics`` verb and its ``create`` subcommand, on the CLI's subparsers."""
    topics = sub.add_parser("topics", help="Kafka topics for pipelines: create")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_sub.add_parser("create", help="create a topic (nothing to do if it exists as asked)")
    create.add_argument("name", help="topic name: letters, digits, '.', '_' or '-'")
    create.add_argument("--partitions", type=_positive, required=True, help="number of partitions (>= 1)")
    create.add_argument(
        "--replication-factor", type=_positive, default=None, help="replicas (default: the broker's default)"
    )
    create.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="topic config, e.g. retention.ms=-1",
    )
    create.add_argument("--timeout", type=float, default=TIMEOUT_S, help=f"seconds (default {TIMEOUT_S:g})")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def parse_configs(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` arguments as a mapping; a pair without '=' is named."""
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--config {pair!r}: expected KEY=VALUE, e.g. retention.ms=604800000")
        configs[key.strip()] = value.strip()
    return configs


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``onceflow topics create``; errors are `OnceflowError`s for the CLI to print as one line."""
    print(
        create_topic(
            settings.kafka_bootstrap,
            args.name,
            args.partitions,
            replication_factor=args.replication_factor,
            configs=parse_configs(args.config),
            timeout_s=args.timeout,
        )
    )
    return 0


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    *,
    replication_factor: int | None = None,
    configs: Mapping[str, str] | None = None,
    timeout_s: float = TIMEOUT_S,
) -> str:
    """Create ``name`` and wait until every partition has a leader; returns what was done, as a line."""
    if not _TOPIC.match(name) or name in {".", ".."}:
        raise ConfigError(f"topic name {name!r}: expected letters, digits, '.', '_' or '-', at most 249")
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(kafka_config(bootstrap, {"socket.timeout.ms": int(timeout_s * 1000)}))
    existing = _partition_count(admin, bootstrap, name, timeout_s)
    if existing is not None:
        return _already(name, existing, partitions)
    topic = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=-1 if replication_factor is None else replication_factor,
        config=dict(configs or {}),
    )
    try:
        admin.create_topics([topic], request_timeout=timeout_s)[name].result(timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if error is not None and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            # another client created it in between
            return _already(name, _partition_count(admin, bootstrap, name, timeout_s) or 0, partitions)
        raise ConfigError(
            f"Kafka at {bootstrap} refused to create topic {name!r}: {kafka_error_text(exc)}"
        ) from exc
    except TimeoutError as exc:
        raise ServiceUnavailable(
            f"Kafka at {bootstrap} did not confirm topic {name!r} within {timeout_s:g} s; "
            f"check with `onceflow topics create {name} --partitions {partitions}` again"
        ) from exc
    wait_for_leaders(admin, name, partitions, timeout_s)
    return f"created topic {name!r} with {partitions} partitions on {bootstrap}"


def _already(name: str, existing: int, partitions: int) -> str:
    if existing != partitions:
        raise ConfigError(
            f"topic {name!r} already exists with {existing} partitions, not {partitions}; onceflow does "
            "not change a topic's partitions: use another name, or keep its partition count"
        )
    return f"topic {name!r} already exists with {partitions} partitions: nothing to do"


def _partition_count(admin: Any, bootstrap: str, name: str, timeout_s: float) -> int | None:
    """The topic's partition count, None when it does not exist; an unreachable Kafka is named."""
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception as exc:  # librdkafka raises KafkaException for every transport failure
        raise ServiceUnavailable(
            f"Kafka at {bootstrap} did not answer within {timeout_s:g} s ({kafka_error_text(exc)}); check "
            "ONCEFLOW_KAFKA_BOOTSTRAP, or start the local stack with `make services`"
        ) from exc
    topic = metadata.topics.get(name)
    return None if topic is None or topic.error is not None else len(topic.partitions)


def wait_for_leaders(admin: Any, name: str, partitions: int, timeout_s: float) -> None:
    """A new topic's partitions get leaders a moment after creation; a producer started before that
    fails its first sends, so return only once they have them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=timeout_s).topics.get(name)
        if (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise OnceflowError(f"topic {name!r} was created but its partitions have no leader after {timeout_s:g} s")
