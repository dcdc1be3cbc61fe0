"""What the sinks that apply a change stream by key share: the rows they take, their settings on top of
their append sink's, and the plan-time check that the pipeline reads a change stream by their key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.sinks.registry import SinkSetting, configured_columns

if TYPE_CHECKING:
    from onceflow.pipeline import Pipeline

# A change row's op (c, r, u, d, t) and its source position, which orders a key's changes.
OP, PARTITION, OFFSET = "_op", "_partition", "_offset"
CHANGE_COLUMNS = (OP, PARTITION, OFFSET)


def change_columns(config: Mapping[str, Any]) -> list[str]:
    """The rows such a sink takes: the table's columns and the change's op and source position."""
    return [*(configured_columns(config) or []), *CHANGE_COLUMNS]


def change_settings(append: Sequence[SinkSetting]) -> tuple[SinkSetting, ...]:
    """The append sink's settings, ``columns`` required, and the key columns."""
    shared = []
    for setting in append:
        if setting.key == "columns":
            setting = SinkSetting(
                "columns",
                "columns",
                setting.meaning.replace("; columns nullable", "; columns nullable, key columns flat"),
                required=True,
            )
        elif setting.key == "rows_per_file":
            setting = SinkSetting(
                "rows_per_file",
                "integer",
                "changes a task stages in one file, at most (and holds in memory)",
                default=setting.default,
                minimum=setting.minimum,
            )
        shared.append(setting)
    return (
        *shared,
        SinkSetting(
            "key_columns",
            "names",
            "the columns that identify a row, what changes are applied by: the change stream's key",
            required=True,
        ),
    )


def stream_key(
    spec: Pipeline, configs: Sequence[Mapping[str, Any]], kind: str, append: str
) -> tuple[str, ...]:
    """The change stream's key (empty when the format names none); a pipeline that reads no change
    stream is refused in one line, naming the ``append`` kind that takes records."""
    from onceflow.pipeline import AvroFormat, JsonFormat

    if not isinstance(spec.format, JsonFormat | AvroFormat) or spec.format.changes is None:
        names = [str(c["name"]) for c in configs]
        raise ConfigError(
            f"sinks {names} ({kind}) apply change events by key: give the format changes=Debezium(...), "
            f"or use the {append} sink for records"
        )
    return tuple(spec.format.changes.key or ())


def check_key_names(where: str, columns: Sequence[str], key_columns: Sequence[str]) -> None:
    """The table's columns may not take the staged changes' own names, and the key columns are some of
    them; one line each."""
    clash = [n for n in columns if n in CHANGE_COLUMNS]
    if clash:
        raise ConfigError(f"{where}: columns {clash} are the staged changes' own")
    unknown = [k for k in key_columns if k not in columns]
    if unknown:
        raise ConfigError(f"{where}: key_columns {unknown} are not among the columns {list(columns)}")


def check_key(where: str, key_columns: Sequence[str], key: Sequence[str]) -> None:
    """Key columns other than the stream's key are refused: only its partitions order a key's changes."""
    if key and set(key_columns) != set(key):
        raise ConfigError(
            f"{where}: key_columns {list(key_columns)} are not the change stream's key {list(key)}, "
            "whose partitions order each key's changes"
        )
