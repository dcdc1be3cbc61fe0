"""Errors that onceflow raises on purpose: each says what is wrong and what to do about it.

Every door (CLI, runner, Airflow task) shows an error as one line; the traceback is for ``--debug`` or
``ONCEFLOW_DEBUG=1`` only, because the line already names the setting or file to fix.
"""

from __future__ import annotations

import os

DEBUG_ENV = "ONCEFLOW_DEBUG"


class OnceflowError(Exception):
    """Base of every error onceflow raises on purpose."""


class ConfigError(OnceflowError):
    """Configuration is missing or invalid; the message names the setting."""


class ServiceUnavailable(OnceflowError):
    """A required service (Kafka, PostgreSQL, the ledger) did not answer."""


class SliceFailed(OnceflowError):
    """The slice could not be pre-committed; the epoch must be aborted and replayed.

    Here, not in the engine, because Spark tasks raise it too, and they import nothing of the coordinator.
    """


def debug_enabled() -> bool:
    """True when ONCEFLOW_DEBUG asks for tracebacks and the Kafka client's own log lines.

    A debug switch, not a setting: read here, where it acts (before any `Settings` exists, and in
    every process alike), like the fault switches of `onceflow.faults`; settings are `onceflow.config`'s.
    """
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def one_line(text: object) -> str:
    """``text`` on one line: a driver's multi-line message (psycopg's hints, librdkafka's detail) joined
    with '; ' and runs of whitespace collapsed."""
    lines = [" ".join(line.split()) for line in str(text).splitlines()]
    return "; ".join(line for line in lines if line)
