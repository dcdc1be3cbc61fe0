"""Fold one epoch's rows into the committed keyed state, in Spark (imported only by the Spark driver).

Given the transform's output for epoch n and the snapshot committed by epoch n-1:

1. aggregate epoch n's rows per key with the reducer (one value per key touched);
2. merge each touched key's aggregate with its previous value (count and sum add, min and max compare);
3. the new snapshot = the previous snapshot without the touched keys, plus the merged rows.

The sinks receive the merged rows (every key the epoch touched, with its new value); the state sink
receives the new snapshot. Both are deterministic functions of the epoch's exact input and the previous
snapshot, so a replayed epoch produces the same state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onceflow.errors import ConfigError
from onceflow.pipeline import StateSpec

DELTA = "_onceflow_delta"


def _aggregate(state: StateSpec) -> Any:
    from pyspark.sql import functions as F

    if state.reducer == "count":
        return F.count(F.lit(1)).cast("long")
    column = F.col(str(state.column))
    return {"sum": F.sum, "min": F.min, "max": F.max}[state.reducer](column)


def _merge(state: StateSpec, previous: Any, delta: Any) -> Any:
    from pyspark.sql import functions as F

    if state.reducer in ("count", "sum"):
        return F.coalesce(previous, F.lit(0)) + delta
    # least/greatest skip nulls, so a key seen for the first time takes the epoch's value.
    return F.least(previous, delta) if state.reducer == "min" else F.greatest(previous, delta)


def fold_epoch(spark: Any, state: StateSpec, rows: Any, snapshot_files: list[Path]) -> tuple[Any, Any]:
    """(touched, snapshot): the new value of every key epoch n touched, and the whole new state.

    Keys that are nested fields (``ctx.ip``) are taken out first, as columns named by `key_columns`."""
    from pyspark.sql import functions as F

    needed = [*state.keys, *([state.column] if state.column else [])]
    missing = [c for c in needed if not _resolves(rows, c)]
    if missing:
        raise ConfigError(
            f"keyed state needs columns {missing} that the transform's output ({rows.columns}) does not have"
        )
    keys = list(state.key_columns)
    if keys != list(state.keys):
        extracted = [F.col(path).alias(name) for path, name in zip(state.keys, keys, strict=True)]
        rows = rows.select(*extracted, *([F.col(str(state.column))] if state.column else []))
    value = state.value_column
    delta = rows.groupBy(*keys).agg(_aggregate(state).alias(DELTA))
    if snapshot_files:
        previous = spark.read.parquet(*[str(p) for p in snapshot_files])
    else:
        schema = delta.withColumnRenamed(DELTA, value).schema
        previous = spark.createDataFrame([], schema)
    touched = delta.join(previous, keys, "left").select(
        *keys, _merge(state, previous[value], delta[DELTA]).alias(value)
    )
    untouched = previous.join(delta.select(*keys), keys, "left_anti")
    return touched, untouched.unionByName(touched)


def _resolves(rows: Any, path: str) -> bool:
    """Whether ``path`` (a column, or a nested field's path) names something in ``rows``' schema."""
    if path in rows.columns:
        return True
    try:
        rows.select(path).schema  # noqa: B018 - resolving is the question
    except Exception:  # Spark's analysis error: no such column or field
        return False
    return True
