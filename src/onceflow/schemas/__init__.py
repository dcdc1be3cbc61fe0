"""The row model's types: the type tree and its canonical text (`types`), and the Avro schemas rows can
hold (`avro`).

A foundation of the pipeline spec: it imports only `onceflow.errors`, so that building a spec needs no
decoder, no Spark and no Avro library.
"""

from onceflow.schemas.types import (
    Array,
    DecimalType,
    Map,
    Primitive,
    SchemaType,
    Struct,
    from_sugar,
    is_flat,
    nullable,
    parse_type,
    render,
    row_type,
)

__all__ = [
    "Array",
    "DecimalType",
    "Map",
    "Primitive",
    "SchemaType",
    "Struct",
    "from_sugar",
    "is_flat",
    "nullable",
    "parse_type",
    "render",
    "row_type",
]
