"""What the sinks that apply a change stream by key share: the rows they take, their settings on top of
their append sink's, and the plan-time check that the pipeline reads a change stream by their key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.sinks.registry import SinkSetting, configured_columns

if TYPE_CHECKING:
    import pyarrow as pa

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


def last_changes(changes: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Every truncate, and per key its last change in source order (the highest offset of its
    partition), in source order. A key's earlier changes are superseded by its last, whether that one
    applies or a later truncate removes it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if changes.num_rows == 0:
        return changes
    ordered = changes.sort_by([(PARTITION, "ascending"), (OFFSET, "ascending")])
    ordered = ordered.append_column("_row", pa.array(range(ordered.num_rows), pa.int64()))
    truncate = pc.fill_null(pc.equal(ordered[OP], "t"), False)
    rows = ordered.filter(pc.invert(truncate)).select([*keys, "_row"])
    last = rows.group_by(list(keys), use_threads=False).aggregate([("_row", "max")])["_row_max"]
    picked = pa.chunked_array([*last.chunks, *ordered.filter(truncate)["_row"].chunks], pa.int64())
    picked = picked.combine_chunks()
    return ordered.take(pc.take(picked, pc.sort_indices(picked))).drop_columns(["_row"])


def _max_offsets(truncates: pa.Table) -> dict[int, int]:
    found: dict[int, int] = {}
    for partition, offset in zip(
        truncates[PARTITION].to_pylist(), truncates[OFFSET].to_pylist(), strict=True
    ):
        found[partition] = max(offset, found.get(partition, offset))
    return found


def applicable(staged: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, bool]:
    """The changes an epoch applies, the last per key in source order without those a later truncate
    of their partition drops, and whether the epoch truncates the table (before applying them)."""
    import pyarrow.compute as pc

    changes = last_changes(staged, keys)
    truncate = pc.fill_null(pc.equal(changes[OP], "t"), False)
    live, truncated = changes.filter(pc.invert(truncate)), changes.filter(truncate)
    for partition, last in _max_offsets(truncated).items():
        before = pc.and_(pc.equal(live[PARTITION], partition), pc.less(live[OFFSET], last))
        live = live.filter(pc.invert(pc.fill_null(before, False)))
    return live, truncated.num_rows > 0
