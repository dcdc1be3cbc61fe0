"""What every Kafka client onceflow builds has in common: librdkafka's own log lines go to Python logging.

Left alone, librdkafka prints each failed connection attempt to stderr (hundreds of ``FAIL`` lines while a
broker is down) ahead of onceflow's one clear line. Routed to the logger ``onceflow.librdkafka``, they are
quiet unless ``ONCEFLOW_DEBUG=1`` or the application gives that logger a level of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from onceflow.errors import debug_enabled, one_line

LOGGER_NAME = "onceflow.librdkafka"


def librdkafka_logger() -> logging.Logger:
    """The logger librdkafka writes to: silent by default, everything with ONCEFLOW_DEBUG."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.DEBUG if debug_enabled() else logging.CRITICAL + 1)
    return logger


def kafka_error_text(exc: BaseException) -> str:
    """A Kafka client error's own text (its `KafkaError`'s, without the wrapper's repr), on one line."""
    from confluent_kafka import KafkaError

    error = exc.args[0] if exc.args else None
    return one_line(error.str() if isinstance(error, KafkaError) else exc)


def kafka_config(bootstrap: str, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A librdkafka configuration for ``bootstrap`` with the logger above and ``settings`` over it."""
    return {"bootstrap.servers": bootstrap, "logger": librdkafka_logger(), **(settings or {})}
