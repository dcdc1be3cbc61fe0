"""The documentation's reference tables, rendered from the code they describe so that they cannot drift.

The sink tables come from each kind's `SinkKind.settings`, the schema types from
`onceflow.pipeline.FIELD_TYPES` and the row types the decoder gives them, the dead-letter reasons from
`onceflow.decoding.records.DEAD_LETTER_CODES` and the spec's arguments from the `Pipeline` dataclass. Each
table sits in docs/configuration.md (`DOCUMENT`) between ``<!-- reference:NAME -->`` and
``<!-- /reference:NAME -->``; ``python -m onceflow.reference`` rewrites them there and ``--check`` only
compares (a unit test does the same, so a change to a sink's settings without its documentation fails the
suite). Another file holding the same markers can be named on the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from onceflow.decoding.records import DEAD_LETTER_CODES, REASON_CHARS, row_columns, spark_schema
from onceflow.errors import ConfigError
from onceflow.pipeline import FIELD_TYPES, METADATA_COLUMNS, PIPELINE_NAME_CHARS, JsonFormat, Pipeline
from onceflow.sinks.registry import SinkKind, SinkSetting, kind_module, known_kinds, sink_kind

# The file that holds the tables, relative to the checkout (where the command is run).
DOCUMENT = Path("docs/configuration.md")
REGENERATE = "python -m onceflow.reference"

# What a JSON value must be for each schema type; a type missing here fails the rendering.
_ACCEPTS = {
    "string": "a string",
    "int": "an integer within 64 bits",
    "float": "a number (an integer becomes a float)",
    "bool": "`true` or `false`",
    "bytes": "base64 text",
    "date": "ISO text `YYYY-MM-DD`",
    "timestamp": "ISO-8601 text with `Z` or an offset (`2026-11-25T12:30:01.5+01:00`), at most to the "
    "microsecond; kept as its UTC instant (text without an offset is a dead letter)",
    "timestamp_ms": "an integer: milliseconds since 1970-01-01 UTC (a `timestamp` column)",
    "timestamp_us": "an integer: microseconds since 1970-01-01 UTC (a `timestamp` column)",
    "decimal(p,s)": "a number or numeric text, exactly (never through a double); one that needs more than "
    "s digits after the point or p - s before it is a dead letter, not rounded",
    "json": "any JSON value, kept as its canonical text (sorted keys, no spaces)",
    "struct<name:T,...>": 'an object with the declared fields (others dropped); also written `{"name": T}`',
    "array<T>": "an array whose every element is a T; also written `[T]`",
    "map<string,T>": "an object whose every value is a T",
}
# A concrete type for each FIELD_TYPES entry that is a pattern, to render its columns.
_EXAMPLES = {
    "decimal(p,s)": "decimal(10,2)",
    "struct<name:T,...>": "struct<name:int>",
    "array<T>": "array<int>",
    "map<string,T>": "map<string,int>",
}
# PostgreSQL column types that hold each Spark row type exactly (a decimal: numeric of its own p and s).
_POSTGRES_TYPES = {
    "string": "text",
    "bigint": "bigint",
    "double": "double precision",
    "boolean": "boolean",
    "binary": "bytea",
    "date": "date",
    "timestamp": "timestamptz",
}


def _postgres_type(spark: str) -> str:
    if spark.startswith("decimal("):
        return "numeric" + spark.removeprefix("decimal")
    return _POSTGRES_TYPES.get(spark, "—")


# What each argument of `Pipeline` means; an argument missing here fails the rendering.
_PIPELINE_ARGS = {
    "name": f"the pipeline's name (`[A-Za-z0-9][A-Za-z0-9_.-]*`, at most {PIPELINE_NAME_CHARS} characters, "
    "so that the DAG tag `onceflow:<name>` fits Airflow's 100): DAG id `onceflow_<name>`, ledger key, part "
    "of transaction ids",
    "source": '`KafkaSource(topics=(…), starting="earliest"|"latest"|ms, on_missing_offsets="fail"|"skip")`',
    "format": "`JsonFormat(schema={field: type}, key_field=None, changes=None)` (`changes=Debezium(key=(…), "
    'decimals="precise"|"string")`: the records are Debezium change events whose rows have the schema, '
    "each row with its op in `_op`, see [change events](#change-events)), "
    '`AvroFormat(schema_file=… or subject=…, wire="registry" or "plain", key_field=None, changes=None)` '
    "(see [Avro](#avro)) or `RawFormat()` (columns `key`, `value`)",
    "sinks": "`SinkSpec(name, kind, {config})` for each output; the keys of each kind are below",
    "transform": "`module:function` taking and returning a Spark DataFrame (or `{sink: DataFrame}`); "
    "without one, the decoded rows go to every sink as they are",
    "state": "`StateSpec(keys=…, reducer=…, column=…)`: keyed state folded across epochs (needs Spark)",
    "guarantee": "`exactly_once`, `at_least_once` or `at_most_once`",
    "slices": "parallel Spark jobs per epoch",
    "max_records_per_partition": "offsets an epoch reads per partition, at most",
    "max_records_per_task": "offsets one read task covers, at most",
    "max_record_bytes": "key plus value size above which a record is a dead letter (`oversized`)",
    "transaction_timeout_s": "how long staged transactions may stay open, and so the longest a slice may "
    "run, on every path: past it the epoch is aborted and replayed by the next run (a hung spark-submit is "
    "killed with its JVM and workers; `onceflow run` interrupts a Spark Connect slice's jobs and leaves a "
    "local one; a DAG's process tasks get it as `execution_timeout`)",
    "max_dead_letters_per_epoch": "dead letters an epoch may keep, at most: past it the epoch aborts with "
    "one line saying how many, nothing of it is committed and the next run replays its range (fix the "
    "input, or raise the bound)",
    "on_rerun": "re-running a committed data interval: `skip`, or `replace` its output",
}


def _code(text: str) -> str:
    """A docstring's ``literal`` as markdown's `literal`."""
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _value(value: str | int | bool) -> str:
    text = json.dumps(value) if isinstance(value, str) else repr(value)
    return f"`{text}`"


def _setting_type(setting: SinkSetting) -> str:
    if setting.choices:
        return " or ".join(f"`{choice}`" for choice in setting.choices)
    if setting.type == "integer":
        return f"integer ≥ {setting.minimum or 0}"
    return {"columns": "mapping", "names": "list of strings"}.get(setting.type, setting.type)


def _setting_default(setting: SinkSetting) -> str:
    if setting.required:
        return "**required**"
    if setting.default is not None:
        return _value(setting.default)
    return setting.default_from or "—"


def _kind_summary(kind: SinkKind) -> str:
    module = importlib.import_module(kind_module(kind.name))
    first = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
    traits = [kind.guarantee.replace("_", "-"), "writes directly" if kind.direct else "staged until commit"]
    if kind.replaceable:
        traits.append('can replace a re-run interval with `on_rerun="replace"`')
    return f"**`{kind.name}`** ({'; '.join(traits)}). {_code(first)}"


def sink_kind_table(kind: SinkKind) -> str:
    """One kind's config keys: type, default and meaning."""
    if not kind.settings:
        raise ConfigError(f"sink kind {kind.name!r} declares no settings (SinkKind.settings)")
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for s in kind.settings:
        row = (f"`{s.key}`", _setting_type(s), _setting_default(s), s.meaning)
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines)


def sinks_reference() -> str:
    parts = []
    for name in known_kinds():
        kind = sink_kind(name)
        parts.append(f"{_kind_summary(kind)}\n\n{sink_kind_table(kind)}")
    return "\n\n".join(parts)


def schema_reference() -> str:
    """The schema's type names, what each accepts and the column types that hold it, and the columns
    and dead-letter reasons every pipeline has."""
    missing = [t for t in FIELD_TYPES if t not in _ACCEPTS]
    if missing:
        raise ConfigError(f"schema types {missing} have no description in onceflow.reference")
    from pyspark.sql.pandas.types import to_arrow_type

    example = JsonFormat({t: _EXAMPLES.get(t, t) for t in FIELD_TYPES})
    spark = {f.name: f.dataType for f in spark_schema(example).fields}
    lines = [
        "| type | a JSON value it accepts | Spark column | Arrow type (`files`) | PostgreSQL column |",
        "| --- | --- | --- | --- | --- |",
    ]
    for t in FIELD_TYPES:
        simple = spark[t].simpleString()
        arrow = str(to_arrow_type(spark[t]))
        postgres = _postgres_type(simple)
        postgres = postgres if postgres == "—" else f"`{postgres}`"
        lines.append(f"| `{_cell(t)}` | {_cell(_ACCEPTS[t])} | `{simple}` | `{arrow}` | {postgres} |")
    meta = ", ".join(
        f"`{name}` ({spark[name].simpleString()})"
        for name, _, _ in row_columns(example)
        if name in METADATA_COLUMNS
    )
    codes = ", ".join(f"`{c}`" for c in DEAD_LETTER_CODES)
    return "\n".join(
        [
            *lines,
            "",
            'A type ending in `?` is nullable: `"int?"` takes null or a missing field as NULL; without '
            "it, such a record is a dead letter. The same holds inside nested types "
            '(`"array<int?>"`, `"struct<ip:string?>"`), and `nullable({"ip": "string?"})` (from '
            "`onceflow.pipeline`) makes sugar nullable. Fields not in the schema are dropped, at every "
            "depth. A dead letter names the value at fault by its path: `items[3].qty`, "
            '`attrs["colour"]`. Every row also '
            f"has the metadata columns {meta}, which sinks may name among their columns.",
            "",
            f"A dead letter's reason is `code: detail`, with one of the codes {codes}; a reason longer "
            f"than {REASON_CHARS} characters is cut there, its end marked `…`.",
        ]
    )


def pipeline_reference() -> str:
    """`Pipeline`'s arguments with their defaults."""
    fields = dataclasses.fields(Pipeline)
    missing = [f.name for f in fields if f.name not in _PIPELINE_ARGS]
    if missing:
        raise ConfigError(f"Pipeline arguments {missing} have no description in onceflow.reference")
    lines = ["| argument | default | meaning |", "| --- | --- | --- |"]
    for f in fields:
        if f.default is dataclasses.MISSING:
            default = "**required**"
        elif f.default is None:
            default = "—"
        else:
            default = _value(f.default)
        lines.append(f"| `{f.name}` | {default} | {_cell(_PIPELINE_ARGS[f.name])} |")
    return "\n".join(lines)


SECTIONS: dict[str, Callable[[], str]] = {
    "pipeline": pipeline_reference,
    "schema": schema_reference,
    "sinks": sinks_reference,
}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- reference:{name} -->\n)(.*?)(<!-- /reference:{name} -->)", re.DOTALL)


def generated_blocks(text: str) -> dict[str, str]:
    """What ``text`` holds between each section's markers (a missing section is an error)."""
    found = {}
    for name in SECTIONS:
        match = _block(name).search(text)
        if match is None:
            raise ConfigError(
                f"no '<!-- reference:{name} -->' ... '<!-- /reference:{name} -->' markers in the document"
            )
        found[name] = match.group(2)
    return found


def render(name: str) -> str:
    """Section ``name`` as it belongs between its markers (ending in a newline)."""
    return SECTIONS[name]() + "\n"


def update(text: str) -> str:
    """``text`` with every section between its markers rendered anew."""
    generated_blocks(text)
    for name in SECTIONS:
        body = render(name)

        def between_markers(match: re.Match[str], body: str = body) -> str:
            return match.group(1) + body + match.group(3)

        text = _block(name).sub(between_markers, text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m onceflow.reference",
        description="rewrite the documentation's generated reference tables",
    )
    parser.add_argument(
        "document",
        nargs="?",
        default=DOCUMENT,
        type=Path,
        help=f"the file that holds them (default: {DOCUMENT})",
    )
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when out of date")
    args = parser.parse_args(argv)
    try:
        text = args.document.read_text(encoding="utf-8")
        updated = update(text)
    except (OSError, ConfigError) as exc:
        print(f"onceflow.reference: error: {args.document}: {exc}", file=sys.stderr)
        return 1
    if updated == text:
        print(f"{args.document}: the reference tables are up to date")
        return 0
    if args.check:
        command = REGENERATE if args.document == DOCUMENT else f"{REGENERATE} {args.document}"
        print(f"{args.document}: the reference tables are out of date; run `{command}`", file=sys.stderr)
        return 1
    args.document.write_text(updated, encoding="utf-8")
    print(f"{args.document}: reference tables rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
