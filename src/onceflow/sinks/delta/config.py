"""The Delta sink's config, and its table's Arrow schema from declared columns or from rows.

Columns are declared with the Iceberg sink's type names (``long``, ``string``, ``timestamp``,
``decimal(p,s)``, row type texts such as ``array<struct<sku:string,qty:int>>``), so that one pipeline
can write either format; they become the plain Arrow types delta-rs maps to Delta's
(``timestamp`` without a zone is Delta's ``timestamp_ntz``).

A table in a bucket (``path: s3://bucket/prefix/table``) is reached with the object-store settings that
onceflow puts in the sink's config under ``s3``: delta-rs gets them as ``storage_options`` (`DeltaConfig.
storage_options`), which make it commit through a put-if-absent, and the staged files and markers go
through a `layout.Store` built with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from onceflow.errors import ConfigError
from onceflow.sinks._config import ConfigReader
from onceflow.sinks.delta import layout
from onceflow.storage.s3 import S3Settings, is_s3

KIND = "delta"


@dataclass(frozen=True)
class DeltaConfig:
    """See the `SinkSetting`s of `SINK_KIND` for what each key means."""

    path: str
    columns: tuple[tuple[str, str], ...] = ()
    partition_by: tuple[str, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()
    create_table: bool = True
    rows_per_file: int = 100_000
    commit_retries: int = 10
    name: str | None = None
    kind: str = KIND  # the sink kind whose config this is, named in errors
    s3: S3Settings | None = None  # the object store of a table in a bucket

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any], check_types: bool = True) -> DeltaConfig:
        config, s3 = layout.take_s3(config, KIND)
        reader = ConfigReader(KIND, config)
        parsed = cls.read(reader, check_types=check_types, s3=s3)
        reader.finish()
        return parsed

    @classmethod
    def read(
        cls,
        reader: ConfigReader,
        columns_required: bool = False,
        check_types: bool = True,
        s3: S3Settings | None = None,
    ) -> DeltaConfig:
        """The table's settings, checked, as ``reader`` reads them for its kind (this one, or a kind that
        writes a Delta table and reads keys of its own before it calls ``reader.finish()``). Without
        ``check_types`` the declared columns' types are taken as the plan checked them: a task's writer
        opens the table the plan made, and parsing the type names (through pyiceberg's types, a third of
        a second to import) would cost every task. ``s3`` is what the config's ``s3`` entry holds
        (`layout.take_s3`)."""
        partitions = reader.columns("partition_by", required=False)
        parsed = cls(
            path=layout.local_or_uri(reader.string("path")),
            columns=reader.columns(required=columns_required),
            partition_by=tuple(name for name, _ in partitions),
            properties=reader.columns("properties", required=False),
            create_table=reader.boolean("create_table", True),
            rows_per_file=reader.integer("rows_per_file", 100_000, minimum=1),
            commit_retries=reader.integer("commit_retries", 10, minimum=0),
            name=reader.optional_string("name"),
            kind=reader.kind,
            s3=s3,
        )
        odd = [f"{n}: {t}" for n, t in partitions if t.strip().lower() != "identity"]
        if odd:
            raise ConfigError(
                f"{parsed.where}: partition_by {odd}: Delta partitions by a column's value only "
                "(`{column: identity}`)"
            )
        if parsed.columns and check_types:
            schema = declared_schema(parsed.columns, parsed.where)
            check_partitions(schema, parsed.partition_by, parsed.where)
        return parsed

    @property
    def where(self) -> str:
        return f"{self.kind} sink {self.name or '?'} table {self.path}"

    @property
    def storage_options(self) -> dict[str, str] | None:
        """delta-rs ``storage_options`` for the table: a bucket's settings (credentials among them: never
        print them), or None for a local table or one whose store delta-rs finds by itself."""
        if self.s3 is None or not is_s3(self.path):
            return None
        return self.s3.delta_options()

    def store(self) -> layout.Store:
        """The file system of the table's staged files and markers."""
        return layout.Store.for_location(self.path, s3=self.s3)

    def open_table(self, version: int | None = None) -> Any:
        """The table (at ``version``, else its latest), as delta-rs reads it."""
        from deltalake import DeltaTable

        return DeltaTable(self.path, version=version, storage_options=self.storage_options)

    def is_table(self) -> bool:
        """Whether there is a Delta table at ``path``."""
        from deltalake import DeltaTable

        return bool(DeltaTable.is_deltatable(self.path, storage_options=self.storage_options))


def as_config(config: DeltaConfig | Mapping[str, Any], check_types: bool = True) -> DeltaConfig:
    return config if isinstance(config, DeltaConfig) else DeltaConfig.from_mapping(config, check_types)


def plain_type(t: Any) -> Any:
    """An Arrow type as Delta keeps it: no field metadata, ``string``/``binary``/``list`` rather than
    their large or view forms; nested fields keep their nullability."""
    import pyarrow as pa

    types = pa.types
    if types.is_large_string(t) or types.is_string_view(t):
        return pa.string()
    if types.is_large_binary(t) or types.is_binary_view(t):
        return pa.binary()
    if types.is_list(t) or types.is_large_list(t) or types.is_list_view(t) or types.is_large_list_view(t):
        field = t.value_field
        return pa.list_(pa.field("element", plain_type(field.type), field.nullable))
    if types.is_struct(t):
        return pa.struct([pa.field(f.name, plain_type(f.type), f.nullable) for f in t])
    if types.is_map(t):
        return pa.map_(
            pa.field("key", plain_type(t.key_type), False),
            pa.field("value", plain_type(t.item_type), t.item_field.nullable),
        )
    if types.is_dictionary(t):
        return plain_type(t.value_type)
    return t


def plain_schema(schema: Any) -> Any:
    """A schema of nullable columns of `plain_type`s (a column itself is always nullable, as a row
    or batch may lack it)."""
    import pyarrow as pa

    return pa.schema([pa.field(f.name, plain_type(f.type), True) for f in schema])


def declared_schema(columns: tuple[tuple[str, str], ...], where: str) -> Any:
    """The Arrow schema of declared columns, through the Iceberg sink's type names."""
    from onceflow.sinks.iceberg import table as tables

    return plain_schema(tables.schema_of(columns, where).as_arrow())


def check_partitions(schema: Any, partition_by: tuple[str, ...], where: str) -> None:
    """Partition columns must be columns of a flat type whose value has one text form."""
    import pyarrow as pa

    names = set(schema.names)
    missing = [p for p in partition_by if p not in names]
    if missing:
        raise ConfigError(f"{where}: partition_by names {missing}, which are not columns {sorted(names)}")
    for p in partition_by:
        t = schema.field(p).type
        if not (
            pa.types.is_string(t) or pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_date(t)
        ):
            raise ConfigError(
                f"{where}: partition column {p!r} has type {t}; use a string, integer, boolean or date column"
            )
