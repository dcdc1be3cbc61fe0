"""The row model's types as a tree, and the one text each has.

A type's text is what a spec carries (`onceflow.pipeline.JsonFormat.schema`, `row_columns`) and what every
sink maps, so it has exactly one spelling: `render` writes it without spaces and `parse_type` reads it
back to an equal tree. The flat texts ("string", "int", "decimal(10,2)", "int?", ...) are the ones the
row model always had, so that a flat pipeline's spec and its sinks' mappings do not change.

Grammar (whitespace between tokens is accepted when parsing, never written)::

    type   := base ["?"]                      "?": the value may be null
    base   := "string" | "int" | "int32" | "float" | "bool" | "bytes" | "date" | "timestamp"
            | "timestamp_ms" | "timestamp_us" | "json" | "decimal(" P "," S ")"
            | "struct<" field ("," field)* ">" | "array<" type ">" | "map<string," type ">"
    field  := name ":" type
    name   := [A-Za-z_][A-Za-z0-9_]*  |  "`" any text, "``" for a backquote "`"

``int`` is 64-bit, ``int32`` only the ``_partition`` metadata column's, ``float`` a double, ``timestamp``
UTC in microseconds, ``json`` a sub-document kept as canonical JSON text, ``decimal(p,s)`` has
1 <= p <= 38 and 0 <= s <= p. ``timestamp_ms`` and ``timestamp_us`` are JSON-only spellings (epoch
integers) of a ``timestamp`` column (`row_type`). Map keys are always strings.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from onceflow.errors import ConfigError

# Primitive type names, the row model's scalar columns.
PRIMITIVES: tuple[str, ...] = (
    "string",
    "int",
    "int32",
    "float",
    "bool",
    "bytes",
    "date",
    "timestamp",
    "timestamp_ms",
    "timestamp_us",
    "json",
)
# Spellings only a JSON format reads (epoch integers); their row column is a "timestamp".
JSON_ONLY: frozenset[str] = frozenset({"timestamp_ms", "timestamp_us"})
# Types no user schema declares: the metadata's partition number.
INTERNAL: frozenset[str] = frozenset({"int32"})
MAX_PRECISION = 38
# Nesting a type text may have: far beyond any record's, and short of the parser's recursion limit.
MAX_DEPTH = 64
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTEGER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Primitive:
    """A scalar column: one of `PRIMITIVES`."""

    name: str
    nullable: bool = False


@dataclass(frozen=True)
class DecimalType:
    """An exact decimal of ``precision`` digits, ``scale`` of them after the point."""

    precision: int
    scale: int
    nullable: bool = False


@dataclass(frozen=True)
class Struct:
    """A nested record: its declared fields, in order (names unique)."""

    fields: tuple[tuple[str, SchemaType], ...]
    nullable: bool = False


@dataclass(frozen=True)
class Array:
    """A list of values of one type (``element.nullable``: may an element be null)."""

    element: SchemaType
    nullable: bool = False


@dataclass(frozen=True)
class Map:
    """String keys to values of one type (``value.nullable``: may a value be null)."""

    value: SchemaType
    nullable: bool = False


SchemaType: TypeAlias = Primitive | DecimalType | Struct | Array | Map


def render(t: SchemaType) -> str:
    """The canonical text of ``t``: no spaces, ``parse_type(render(t)) == t``."""
    if isinstance(t, Primitive):
        text = t.name
    elif isinstance(t, DecimalType):
        text = f"decimal({t.precision},{t.scale})"
    elif isinstance(t, Struct):
        text = "struct<" + ",".join(f"{quote_name(n)}:{render(f)}" for n, f in t.fields) + ">"
    elif isinstance(t, Array):
        text = f"array<{render(t.element)}>"
    else:
        text = f"map<string,{render(t.value)}>"
    return text + "?" if t.nullable else text


def quote_name(name: str) -> str:
    """A struct field's name as the grammar writes it: bare when an identifier, else in backquotes."""
    if _IDENTIFIER.fullmatch(name):
        return name
    return "`" + name.replace("`", "``") + "`"


def with_nullable(t: SchemaType, nullable: bool) -> SchemaType:
    """``t`` with its own nullability set (what it holds unchanged)."""
    return t if t.nullable == nullable else dataclasses.replace(t, nullable=nullable)


def is_flat(t: SchemaType) -> bool:
    """Whether ``t`` is a scalar (a primitive or a decimal), not a struct, array or map."""
    return isinstance(t, Primitive | DecimalType)


def struct_fields(t: SchemaType) -> Iterator[tuple[str, SchemaType]]:
    """The (name, type) fields of a struct; nothing for other types."""
    if isinstance(t, Struct):
        yield from t.fields


def children(t: SchemaType) -> tuple[SchemaType, ...]:
    """The types ``t`` holds directly: a struct's fields, an array's element, a map's value."""
    if isinstance(t, Struct):
        return tuple(f for _, f in t.fields)
    if isinstance(t, Array):
        return (t.element,)
    if isinstance(t, Map):
        return (t.value,)
    return ()


def walk(t: SchemaType) -> Iterator[SchemaType]:
    """``t`` and every type inside it, depth first."""
    yield t
    for child in children(t):
        yield from walk(child)


def nesting(t: SchemaType) -> int:
    """How many levels deep ``t`` nests: 0 for a scalar, 1 for ``array<int>``."""
    inner = children(t)
    return 1 + max(nesting(c) for c in inner) if inner else 0


def primitive_names(t: SchemaType) -> frozenset[str]:
    """The primitive names used anywhere in ``t`` (``decimal`` for any decimal)."""
    return frozenset(
        s.name if isinstance(s, Primitive) else "decimal"
        for s in walk(t)
        if isinstance(s, Primitive | DecimalType)
    )


def row_type(t: SchemaType) -> SchemaType:
    """The row column's type of a declared type: the JSON-only epoch spellings become ``timestamp``."""
    if isinstance(t, Primitive):
        return Primitive("timestamp", t.nullable) if t.name in JSON_ONLY else t
    if isinstance(t, Struct):
        return Struct(tuple((n, row_type(f)) for n, f in t.fields), t.nullable)
    if isinstance(t, Array):
        return Array(row_type(t.element), t.nullable)
    if isinstance(t, Map):
        return Map(row_type(t.value), t.nullable)
    return t


def parse_type(text: str, where: str = "type") -> SchemaType:
    """The tree of a type text; a one-line `ConfigError` naming ``where`` and the position otherwise."""
    if not isinstance(text, str):
        raise ConfigError(f"{where}={text!r}: expected a type text")
    return _parse_cached(text, where)


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str, where: str) -> SchemaType:
    # Specs are rebuilt from JSON in every task, with the same few texts: parse each once per process.
    parser = _Parser(text, where)
    parsed = parser.type(0)
    parser.skip()
    if parser.pos != len(text):
        raise parser.error("unexpected text after the type")
    return parsed


class _Parser:
    """Recursive descent over a type text; ``pos`` is the index of the next character."""

    def __init__(self, text: str, where: str) -> None:
        self.text, self.where, self.pos = text, where, 0

    def error(self, problem: str, pos: int | None = None, hint: str = "") -> ConfigError:
        at = self.pos if pos is None else pos
        return ConfigError(f"{self.where}={self.text!r}: {problem} at position {at}{hint}")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def take(self, token: str) -> bool:
        self.skip()
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str, what: str) -> None:
        if not self.take(token):
            found = repr(self.text[self.pos]) if self.pos < len(self.text) else "the end"
            raise self.error(f"expected {what}, found {found}")

    def word(self) -> str:
        self.skip()
        found = _IDENTIFIER.match(self.text, self.pos)
        return found.group() if found else ""

    def type(self, depth: int) -> SchemaType:
        if depth > MAX_DEPTH:
            raise self.error(f"types nest deeper than {MAX_DEPTH} levels")
        start = self.pos
        name = self.word()
        self.pos += len(name)
        base: SchemaType
        if name in PRIMITIVES:
            base = Primitive(name)
        elif name == "decimal":
            base = self.decimal(start)
        elif name == "struct":
            base = self.struct(depth)
        elif name == "array":
            self.expect("<", "'<' after 'array'")
            base = Array(self.type(depth + 1))
            self.expect(">", "'>' closing array<")
        elif name == "map":
            self.expect("<", "'<' after 'map'")
            key_at = self.pos
            if self.word() != "string":
                self.skip()
                raise self.error("map keys must be 'string' (map<string,T>)", max(key_at, self.pos))
            self.pos += len("string")
            self.expect(",", "',' after the map's key type")
            base = Map(self.type(depth + 1))
            self.expect(">", "'>' closing map<")
        else:
            self.skip()
            shown = f"unknown type {name!r}" if name else "expected a type"
            known = [t for t in PRIMITIVES if t not in INTERNAL]
            hint = ", ".join([*known, "decimal(p,s)", "struct<name:T,...>", "array<T>", "map<string,T>"])
            raise self.error(shown, start if name else self.pos, f" (known: {hint})")
        if self.take("?"):
            base = with_nullable(base, True)
        return base

    def decimal(self, start: int) -> DecimalType:
        self.expect("(", "'(' after 'decimal'")
        precision = self.integer("the precision")
        self.expect(",", "',' between precision and scale")
        scale = self.integer("the scale")
        self.expect(")", "')' closing decimal(")
        if not 1 <= precision <= MAX_PRECISION or not 0 <= scale <= precision:
            raise self.error(
                f"decimal({precision},{scale}) needs 1 <= precision <= {MAX_PRECISION} and "
                "0 <= scale <= precision",
                start,
            )
        return DecimalType(precision, scale)

    def integer(self, what: str) -> int:
        self.skip()
        found = _INTEGER.match(self.text, self.pos)
        if found is None or len(found.group()) > 4:
            raise self.error(f"expected {what} as a small integer")
        self.pos = found.end()
        return int(found.group())

    def struct(self, depth: int) -> Struct:
        self.expect("<", "'<' after 'struct'")
        fields: list[tuple[str, SchemaType]] = []
        seen: set[str] = set()
        while True:
            self.skip()
            at = self.pos
            name = self.name()
            if name in seen:
                raise self.error(f"field {name!r} is declared twice", at)
            seen.add(name)
            self.expect(":", f"':' after field name {name!r}")
            fields.append((name, self.type(depth + 1)))
            if self.take(">"):
                return Struct(tuple(fields))
            self.expect(",", "',' or '>' after a struct field")

    def name(self) -> str:
        if self.pos < len(self.text) and self.text[self.pos] == "`":
            chars: list[str] = []
            i = self.pos + 1
            while i < len(self.text):
                if self.text[i] == "`":
                    if self.text.startswith("``", i):
                        chars.append("`")
                        i += 2
                        continue
                    break
                chars.append(self.text[i])
                i += 1
            else:
                raise self.error("unclosed backquote in a field name")
            if not chars:
                raise self.error("a field name may not be empty")
            self.pos = i + 1
            return "".join(chars)
        name = self.word()
        if not name:
            raise self.error("expected a field name (an identifier, or any text in backquotes)")
        self.pos += len(name)
        return name


def field_path(path: str, name: str) -> str:
    """A struct field's path in a dead letter's reason: ``ctx.ip``, or ``ctx["x y"]`` for a name that
    is not an identifier (both decoders name a value's place the same way)."""
    return f"{path}.{name}" if _IDENTIFIER.fullmatch(name) else f"{path}[{json.dumps(name)}]"


def key_path(path: str, key: str) -> str:
    """A map value's path, ``attrs["colour"]``: the key as JSON text (ASCII, so every reason is UTF-8),
    cut at 64 characters so that a hostile key cannot make a long reason."""
    return f"{path}[{json.dumps(key[:64])}{'...' if len(key) > 64 else ''}]"


# JSON-shaped schemas: a dict is a struct of its fields, a one-element list an array of its element.
Sugar: TypeAlias = str | Mapping[str, "Sugar"] | list["Sugar"]


def from_sugar(value: object, where: str) -> SchemaType:
    """The tree of a type text or of JSON-shaped sugar (dicts and one-element lists, both required,
    with type texts or sugar inside), so that a schema can be written as its documents look."""
    found = _from_sugar(value, where, 0)
    if nesting(found) > MAX_DEPTH:  # texts inside sugar: their text must parse back
        raise ConfigError(f"{where}: types nest deeper than {MAX_DEPTH} levels")
    return found


def _from_sugar(value: object, where: str, depth: int) -> SchemaType:
    if depth > MAX_DEPTH:
        raise ConfigError(f"{where}: types nest deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        return parse_type(value, where)
    if isinstance(value, Mapping):
        if not value:
            raise ConfigError(f"{where}={{}}: a struct needs at least one field")
        fields: list[tuple[str, SchemaType]] = []
        for name, inner in value.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{where}: field names must be non-empty strings, found {name!r}")
            fields.append((name, _from_sugar(inner, f"{where}[{name!r}]", depth + 1)))
        return Struct(tuple(fields))
    if isinstance(value, list):
        if len(value) != 1:
            raise ConfigError(
                f"{where}: a list declares an array by its one element type, found {len(value)} elements"
            )
        return Array(_from_sugar(value[0], f"{where}[0]", depth + 1))
    raise ConfigError(
        f"{where}={value!r}: expected a type text, a dict of fields (a struct) "
        "or a one-element list (an array)"
    )


def nullable(value: Sugar) -> str:
    """The canonical text of a type text or sugar, made nullable: ``nullable({"ip": "string?"})`` is
    ``"struct<ip:string?>?"``, for a field that may be null or absent while sugar stays readable."""
    return render(with_nullable(from_sugar(value, "nullable(...)"), True))
