"""The row model's type texts: one canonical text per type, parsed back to the same tree, refused in one
line naming the position, and JSON-shaped sugar normalised to the same texts; flat schemas unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.errors import ConfigError
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.pipeline import nullable as nullable_from_pipeline
from onceflow.schemas import nullable
from onceflow.schemas.types import (
    MAX_DEPTH,
    PRIMITIVES,
    Array,
    DecimalType,
    Map,
    Primitive,
    SchemaType,
    Struct,
    field_path,
    from_sugar,
    is_flat,
    key_path,
    nesting,
    parse_type,
    primitive_names,
    quote_name,
    render,
    row_type,
    struct_fields,
    walk,
    with_nullable,
)

# The texts every sink maps today: they must stay exactly these.
FLAT_TEXTS = ["string", "int", "int32", "float", "bool", "bytes", "timestamp", "date", "decimal(10,2)"]

_NAMES = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True),
    st.text(min_size=1, max_size=6),  # spaces, backquotes, colons, commas, non-ASCII, ...
    st.sampled_from(["`", "``", "a`b", "x y", "int", "struct", "a:b", "a,b", "<>", "é", "?"]),
)


def _leaf(nullable: bool) -> st.SearchStrategy[SchemaType]:
    decimals = st.integers(1, 38).flatmap(
        lambda p: st.builds(DecimalType, st.just(p), st.integers(0, p), st.just(nullable))
    )
    return st.one_of(st.builds(Primitive, st.sampled_from(PRIMITIVES), st.just(nullable)), decimals)


def _struct_fields(inner: st.SearchStrategy[SchemaType]) -> st.SearchStrategy[tuple[tuple[str, Any], ...]]:
    return st.lists(st.tuples(_NAMES, inner), min_size=1, max_size=4, unique_by=lambda f: f[0]).map(tuple)


TYPES: st.SearchStrategy[SchemaType] = st.recursive(
    st.booleans().flatmap(_leaf),
    lambda inner: st.one_of(
        st.builds(Array, inner, st.booleans()),
        st.builds(Map, inner, st.booleans()),
        st.builds(Struct, _struct_fields(inner), st.booleans()),
    ),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(TYPES)
def test_every_type_renders_to_a_text_that_parses_back_to_it(t: SchemaType) -> None:
    text = render(t)
    assert parse_type(text) == t
    assert render(parse_type(text)) == text
    outside_names = text
    # longest first: a short name ("a") may be a piece of a longer quoted one ("`a b`")
    quoted = sorted(
        {quote_name(name) for s in _all(t) for name, _ in struct_fields(s)}, key=len, reverse=True
    )
    for name in quoted:
        outside_names = outside_names.replace(name, "")
    assert " " not in outside_names  # canonical: no spaces, except inside quoted names


def _all(t: SchemaType) -> list[SchemaType]:
    return list(walk(t))


@pytest.mark.parametrize("text", FLAT_TEXTS)
def test_the_flat_texts_are_their_own_canonical_texts(text: str) -> None:
    for spelled in (text, text + "?"):
        parsed = parse_type(spelled)
        assert render(parsed) == spelled
        assert is_flat(parsed) and parsed.nullable == spelled.endswith("?")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (" array < int ? > ? ", Array(Primitive("int", True), True)),
        ("decimal( 38 , 0 )", DecimalType(38, 0)),
        ("map<string, json>", Map(Primitive("json"))),
        (
            "struct<a:int, `x y`:string?, `a``b`:array<bool>>",
            Struct(
                (
                    ("a", Primitive("int")),
                    ("x y", Primitive("string", True)),
                    ("a`b", Array(Primitive("bool"))),
                )
            ),
        ),
        (
            "struct<int:int,struct:string>",
            Struct((("int", Primitive("int")), ("struct", Primitive("string")))),
        ),
    ],
)
def test_spaces_are_read_but_never_written(text: str, expected: SchemaType) -> None:
    assert parse_type(text) == expected
    assert " " not in render(expected).replace("`x y`", "")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("integer", "t='integer': unknown type 'integer' at position 0 (known: string, int, float,"),
        ("", "t='': expected a type at position 0 (known: "),
        ("array<int", "t='array<int': expected '>' closing array<, found the end at position 9"),
        ("array<>", "t='array<>': expected a type at position 6"),
        ("array int", "t='array int': expected '<' after 'array', found 'i' at position 6"),
        ("map<int,string>", "t='map<int,string>': map keys must be 'string' (map<string,T>) at position 4"),
        ("map<string>", "t='map<string>': expected ',' after the map's key type, found '>' at position 10"),
        (
            "decimal(39,1)",
            "decimal(39,1) needs 1 <= precision <= 38 and 0 <= scale <= precision at position 0",
        ),
        ("decimal(0,0)", "decimal(0,0) needs 1 <= precision <= 38"),
        ("decimal(5,6)", "decimal(5,6) needs 1 <= precision <= 38 and 0 <= scale <= precision"),
        ("decimal(5)", "t='decimal(5)': expected ',' between precision and scale, found ')' at position 9"),
        ("decimal(a,1)", "t='decimal(a,1)': expected the precision as a small integer at position 8"),
        ("decimal(99999,1)", "expected the precision as a small integer at position 8"),
        ("decimal", "t='decimal': expected '(' after 'decimal', found the end at position 7"),
        (
            "struct<>",
            "t='struct<>': expected a field name (an identifier, or any text in backquotes) at position 7",
        ),
        ("struct<a:int,a:int>", "t='struct<a:int,a:int>': field 'a' is declared twice at position 13"),
        ("struct<a int>", "t='struct<a int>': expected ':' after field name 'a', found 'i' at position 9"),
        (
            "struct<a:int;b:int>",
            "t='struct<a:int;b:int>': expected ',' or '>' after a struct field, found ';'",
        ),
        ("struct<`a:int>", "t='struct<`a:int>': unclosed backquote in a field name at position 7"),
        ("struct<``:int>", "t='struct<``:int>': a field name may not be empty at position 7"),
        ("int??", "t='int??': unexpected text after the type at position 4"),
        ("array<int>x", "t='array<int>x': unexpected text after the type at position 10"),
        ("INT", "t='INT': unknown type 'INT' at position 0"),
    ],
)
def test_a_bad_text_is_refused_in_one_line_naming_the_position(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_type(text, "t")
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_text_nesting_past_the_limit_is_refused_and_the_limit_itself_is_read() -> None:
    at_limit = "array<" * MAX_DEPTH + "int" + ">" * MAX_DEPTH
    assert nesting(parse_type(at_limit)) == MAX_DEPTH
    beyond = "array<" * (MAX_DEPTH + 1) + "int" + ">" * (MAX_DEPTH + 1)
    with pytest.raises(ConfigError, match=f"types nest deeper than {MAX_DEPTH} levels"):
        parse_type(beyond)
    with pytest.raises(ConfigError, match="nest deeper"):
        parse_type("array<" * 100_000)  # no RecursionError, whatever the text
    with pytest.raises(ConfigError, match="nest deeper"):
        from_sugar({"a": [at_limit]}, "format.schema['a']")  # sugar around a text counts too


def test_a_type_text_must_be_text() -> None:
    with pytest.raises(ConfigError, match="t=5: expected a type text"):
        parse_type(5, "t")  # type: ignore[arg-type]


def test_the_helpers_answer_for_nested_types() -> None:
    t = parse_type("struct<items:array<struct<at:timestamp_ms,p:decimal(9,2)?>>,tags:map<string,json?>?>")
    assert not is_flat(t) and is_flat(parse_type("decimal(9,2)?"))
    assert [name for name, _ in struct_fields(t)] == ["items", "tags"]
    assert list(struct_fields(parse_type("int"))) == []
    assert primitive_names(t) == {"timestamp_ms", "decimal", "json"}
    assert nesting(t) == 3 and nesting(parse_type("int")) == 0
    assert (
        render(row_type(t))
        == "struct<items:array<struct<at:timestamp,p:decimal(9,2)?>>,tags:map<string,json?>?>"
    )
    assert row_type(parse_type("timestamp_us?")) == Primitive("timestamp", True)
    assert with_nullable(t, True) == parse_type(render(t) + "?")
    assert field_path("ctx", "ip") == "ctx.ip" and field_path("ctx", "x y") == 'ctx["x y"]'
    assert key_path("attrs", "colour") == 'attrs["colour"]'
    assert key_path("a", "k" * 100) == 'a["' + "k" * 64 + '"...]'
    assert key_path("a", "\ud800").encode("utf-8") == b'a["\\ud800"]'  # a reason is always UTF-8


@pytest.mark.parametrize(
    ("sugar", "canonical"),
    [
        ({"sku": "string", "qty": "int"}, "struct<sku:string,qty:int>"),
        ([{"sku": "string", "qty": "int"}], "array<struct<sku:string,qty:int>>"),
        ([["int?"]], "array<array<int?>>"),
        ({"ip": "string?"}, "struct<ip:string?>"),
        ({"a b": {"c": ["decimal( 10, 2 )"]}}, "struct<`a b`:struct<c:array<decimal(10,2)>>>"),
        ({"m": "map<string,struct<x:int>>?"}, "struct<m:map<string,struct<x:int>>?>"),
        ("struct< ip : string? >?", "struct<ip:string?>?"),
    ],
)
def test_sugar_is_normalised_to_the_canonical_text(sugar: Any, canonical: str) -> None:
    assert render(from_sugar(sugar, "s")) == canonical
    assert JsonFormat({"f": sugar}).schema["f"] == canonical


def test_nullable_makes_text_or_sugar_nullable() -> None:
    assert nullable({"ip": "string?"}) == "struct<ip:string?>?"
    assert nullable([{"sku": "string"}]) == "array<struct<sku:string>>?"
    assert nullable("int") == nullable("int?") == "int?"
    assert nullable_from_pipeline is nullable  # next to JsonFormat
    fmt = JsonFormat({"ctx": nullable({"ip": "string?"})})
    assert fmt.field_type("ctx") == ("struct<ip:string?>", True)


@pytest.mark.parametrize(
    ("sugar", "message"),
    [
        ({}, r"format.schema\['f'\]={}: a struct needs at least one field"),
        ([], r"format.schema\['f'\]: a list declares an array by its one element type, found 0 elements"),
        (["int", "string"], "found 2 elements"),
        ({"a": 5}, r"format.schema\['f'\]\['a'\]=5: expected a type text, a dict of fields"),
        ({"": "int"}, "field names must be non-empty strings, found ''"),
        (
            {"a": [{"b": "integer"}]},
            r"format.schema\['f'\]\['a'\]\[0\]\['b'\]='integer': unknown type 'integer'",
        ),
        ("int32", r"format.schema\['f'\]='int32': type 'int32' is the metadata's; use 'int'"),
        ({"p": "array<int32>"}, "type 'int32' is the metadata's"),
        (None, r"format.schema\['f'\]=None: expected a type text"),
    ],
)
def test_bad_sugar_is_refused_naming_the_field(sugar: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        JsonFormat({"f": sugar})
    assert "\n" not in str(raised.value)


def _spec(fmt: JsonFormat) -> Pipeline:
    return Pipeline(
        "p", KafkaSource(("t",)), fmt, (SinkSpec("out", "files", {"root": "/tmp/x", "table": "t"}),)
    )


def test_a_flat_schema_is_kept_byte_for_byte() -> None:
    declared = {"id": "int", "name": "string?", "score": "float", "ok": "bool?"}
    fmt = JsonFormat(declared, key_field="k")
    assert dict(fmt.schema) == declared and list(fmt.schema) == list(declared)
    assert [fmt.field_type(n) for n in declared] == [
        ("int", False),
        ("string", True),
        ("float", False),
        ("bool", True),
    ]
    spec = _spec(fmt)
    assert json.loads(spec.to_json())["format"] == {"type": "json", "schema": declared, "key_field": "k"}
    assert Pipeline.from_json(spec.to_json()) == spec


def test_a_nested_schema_travels_as_its_canonical_texts() -> None:
    fmt = JsonFormat(
        {
            "items": [{"sku": "string", "qty": "int"}],
            "ctx": nullable({"ip": "string?"}),
            "at": "timestamp_ms",
            "price": "decimal(10, 2)?",
            "attrs": "map<string, json>",
        }
    )
    assert dict(fmt.schema) == {
        "items": "array<struct<sku:string,qty:int>>",
        "ctx": "struct<ip:string?>?",
        "at": "timestamp_ms",
        "price": "decimal(10,2)?",
        "attrs": "map<string,json>",
    }
    spec = _spec(fmt)
    again = Pipeline.from_json(spec.to_json())
    assert again == spec and dict(again.format.schema) == dict(fmt.schema)  # type: ignore[union-attr]
    assert JsonFormat(dict(fmt.schema)) == fmt  # canonical texts are a fixed point
