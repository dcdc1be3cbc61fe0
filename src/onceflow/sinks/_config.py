"""Reading a sink's plain config mapping into typed values, with errors that name the setting.

Configs arrive as plain mappings (from a pipeline spec, the ledger or a Spark closure), so every value is
checked here once instead of failing later with a confusing error deep inside a driver library.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from onceflow import redact
from onceflow.errors import ConfigError
from onceflow.storage.s3 import S3Settings, is_s3, split


class ConfigReader:
    """Typed access to one sink's config; `finish()` rejects keys nobody read (typos are not ignored)."""

    def __init__(self, kind: str, config: Mapping[str, Any]) -> None:
        if not isinstance(config, Mapping):
            raise ConfigError(f"{kind} sink config must be a mapping, got {type(config).__name__}")
        self.kind = kind
        self._config = config
        self._read: set[str] = set()

    def _get(self, key: str) -> Any:
        self._read.add(key)
        return self._config.get(key)

    def _fail(self, key: str, expected: str, value: Any) -> ConfigError:
        shown = redact.MASK if redact.secret_key(key) else redact.shown(value)
        return ConfigError(f"{self.kind} sink config {key}={shown!r}: expected {expected}")

    def string(self, key: str, default: str | None = None) -> str:
        value = self._get(key)
        if value is None:
            if default is None:
                raise ConfigError(f"{self.kind} sink config: {key!r} is required")
            return default
        if not isinstance(value, str) or not value:
            raise self._fail(key, "a non-empty string", value)
        return value

    def optional_string(self, key: str) -> str | None:
        value = self._get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise self._fail(key, "a non-empty string", value)
        return value

    def integer(self, key: str, default: int, minimum: int = 0) -> int:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._fail(key, f"an integer >= {minimum}", value)
        return value

    def optional_integer(self, key: str, minimum: int = 0) -> int | None:
        if self._config.get(key) is None:
            self._read.add(key)
            return None
        return self.integer(key, 0, minimum)

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(key, "true or false", value)
        return value

    def optional_mapping(self, key: str) -> Mapping[str, Any] | None:
        """A nested mapping of settings (its values are checked by whoever reads it)."""
        value = self._get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ConfigError(f"{self.kind} sink config {key}: expected a mapping of settings")
        return value

    def path(self, key: str, s3_url: bool = False) -> str:
        """A local path, made absolute; with ``s3_url``, an ``s3://bucket/prefix`` URL is taken too, as it
        is (the sink keeps its files in a bucket then)."""
        value = self.string(key)
        if not (s3_url and is_s3(value)):
            return os.path.abspath(value)
        try:
            split(value)
        except ConfigError as exc:
            raise ConfigError(f"{self.kind} sink config {key}: {exc}") from None
        return value.rstrip("/")

    def columns(self, key: str = "columns", required: bool = True) -> tuple[tuple[str, str], ...]:
        """Columns as ordered (name, SQL or Arrow type) pairs, from a mapping or a list of pairs."""
        value = self._get(key)
        if value is None:
            if required:
                raise ConfigError(f"{self.kind} sink config: {key!r} is required (column name -> type)")
            return ()
        pairs: list[tuple[Any, Any]]
        if isinstance(value, Mapping):
            pairs = list(value.items())
        elif isinstance(value, list | tuple) and all(
            isinstance(p, list | tuple) and len(p) == 2 for p in value
        ):
            pairs = [(p[0], p[1]) for p in value]
        else:
            raise self._fail(key, "a mapping of column name -> type, or a list of [name, type] pairs", value)
        if not pairs:
            raise self._fail(key, "at least one column", value)
        for name, type_ in pairs:
            if not isinstance(name, str) or not name or not isinstance(type_, str) or not type_:
                raise self._fail(key, "non-empty string column names and types", value)
        names = [str(n) for n, _ in pairs]
        if len(set(names)) != len(names):
            raise self._fail(key, "distinct column names", value)
        return tuple((str(n), str(t)) for n, t in pairs)

    def string_list(self, key: str) -> tuple[str, ...]:
        value = self._get(key)
        if (
            not isinstance(value, list | tuple)
            or not value
            or not all(isinstance(v, str) and v for v in value)
        ):
            raise self._fail(key, "a non-empty list of names", value)
        return tuple(value)

    def finish(self) -> None:
        unknown = sorted(set(self._config) - self._read - {"kind"})
        if unknown:
            raise ConfigError(f"{self.kind} sink config: unknown setting(s) {', '.join(map(repr, unknown))}")


def deployment_default(kind: str, key: str, where: str) -> ConfigError:
    """The error for a key that the kind's `SinkKind.defaults` fills from the deployment's settings when
    the config is built with `SinkKind.config_for`, but that this config lacks (it was built by hand)."""
    return ConfigError(
        f"{kind} sink config: {key!r} is missing; set it, or build the config with "
        f"SinkKind.config_for(sink, settings), which fills it from {where}"
    )


def take_s3(config: Mapping[str, Any], kind: str) -> tuple[dict[str, Any], S3Settings | None]:
    """A sink config without its ``s3`` entry, and the object-store settings that entry holds (None
    without one). onceflow adds the entry to the config of a sink that names an ``s3://`` location, as
    it adds ``name``; it is no setting a user writes, so the config's own reader never sees it."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{kind} sink config must be a mapping, got {type(config).__name__}")
    rest = {k: v for k, v in config.items() if k != "s3"}
    if config.get("s3") is None:
        return rest, None
    return rest, S3Settings.from_config(config["s3"], f"{kind} sink {config.get('name') or '?'}")
