"""Rows across the Python/JVM boundary of a slice job as Arrow record batches.

The slice job's executors decode records in Python and its sink writers stage what the transform
returns, while the transform runs in the JVM. Crossing as pickled rows (``createDataFrame`` over an RDD, then
``DataFrame.rdd``) pickles every row and rebuilds it as an object on the other side; Arrow batches
(``mapInArrow``) move whole columns instead. Writers that take batches keep them as they are; only
a writer that takes rows gets them as dicts, maps as dicts too (`batch_rows`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Any

# Rows per Arrow batch: large enough to amortize the per-batch cost, small enough to bound an
# executor's memory to a few MB per task whatever the epoch's size.
BATCH_ROWS = 10_000


def arrow_schema(spark_schema: Any) -> Any:
    """The Arrow schema Spark expects from ``mapInArrow`` for a Spark StructType."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema)


def row_batches(rows: Iterable[tuple[Any, ...]], schema: Any, size: int = BATCH_ROWS) -> Iterator[Any]:
    """Arrow record batches of ``schema`` from row tuples in the schema's column order."""
    import pyarrow as pa

    rows = iter(rows)
    while chunk := list(islice(rows, size)):
        columns = zip(*chunk, strict=True)
        yield pa.RecordBatch.from_arrays(
            [pa.array(column, type=field.type) for column, field in zip(columns, schema, strict=True)],
            schema=schema,
        )


def rows_of(batch: Any) -> list[dict[str, Any]]:
    """An Arrow record batch's rows as dicts, in the row model's shape: a map is a dict at any depth
    (inside a struct, a list or another map), as the Python decoder gives it, where a plain
    ``to_pylist`` gives a list of (key, value) pairs. Keys are unique (Spark's maps refuse duplicates;
    a batch that had one fails here, not as a row that lost a value)."""
    rows: list[dict[str, Any]] = batch.to_pylist(maps_as_pydicts="strict")
    return rows


def batch_rows(batches: Iterable[Any]) -> Iterator[Mapping[str, Any]]:
    """The rows of Arrow record batches as dicts (`rows_of`), the shape a writer without
    ``write_batch`` takes."""
    for batch in batches:
        yield from rows_of(batch)
