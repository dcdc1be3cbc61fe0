"""The names onceflow builds paths, SQL gids, consumer groups and Kafka transactional ids from."""

from __future__ import annotations

import re

from onceflow.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def check_name(what: str, value: str) -> str:
    """Accept names that are safe in paths, SQL gids and Kafka transactional ids (no ':' or '/'), so
    that joining them with ':' or '/' is unambiguous."""
    if not isinstance(value, str) or not _NAME.match(value) or value in {".", ".."}:
        raise ConfigError(f"{what}={value!r}: expected letters, digits, '_', '.' or '-'")
    return value
