"""The documented reference tables (docs/configuration.md) are the ones the code renders, and each sink
kind's declared settings are exactly what its config parser reads (keys, types, defaults, bounds, choices)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from onceflow import reference
from onceflow.config import Settings
from onceflow.errors import ConfigError
from onceflow.pipeline import SinkSpec
from onceflow.sinks import build_committer, known_kinds, sink_kind
from onceflow.sinks._config import ConfigReader
from onceflow.sinks.registry import SinkSetting

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = ROOT / reference.DOCUMENT
# The setting type each ConfigReader method reads.
READER_TYPES = {
    "string": "string",
    "optional_string": "string",
    "integer": "integer",
    "optional_integer": "integer",
    "boolean": "boolean",
    "path": "path",
    "columns": "columns",
    "string_list": "names",
}


def test_the_documented_tables_are_the_generated_ones() -> None:
    found = reference.generated_blocks(DOCUMENT.read_text(encoding="utf-8"))
    for name in reference.SECTIONS:
        assert found[name] == reference.render(name), (
            f"{reference.DOCUMENT}'s '{name}' reference is out of date: run `{reference.REGENERATE}`"
        )


def test_the_command_checks_the_documented_tables_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    assert reference.main(["--check"]) == 0
    assert str(reference.DOCUMENT) in capsys.readouterr().out


def _sample(setting: SinkSetting, folder: Path) -> Any:
    return {
        "string": "t",
        "path": str(folder),
        "columns": {"id": "int64"},
        "names": ["id"],
        "integer": 1000,
        "boolean": True,
    }[setting.type]


def _required_config(kind: str, folder: Path) -> dict[str, Any]:
    """The required settings, and what the kind's defaults fill from the deployment's settings."""
    required = {s.key: _sample(s, folder) for s in sink_kind(kind).settings if s.required}
    return sink_kind(kind).config_for(
        SinkSpec("s", kind, required), Settings.from_env({"ONCEFLOW_HOME": str(folder)})
    )


def _record_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every key a ConfigReader is asked for, with the method and its arguments (outermost call only:
    ``path`` reads through ``string``)."""
    reads: dict[str, tuple[str, dict[str, Any]]] = {}
    depth = [0]

    def wrap(method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def recording(self: ConfigReader, *args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            if depth[0] == 0:
                reads[bound.arguments["key"]] = (method, dict(bound.arguments))
            depth[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                depth[0] -= 1

        return recording

    for method in READER_TYPES:
        monkeypatch.setattr(ConfigReader, method, wrap(method, getattr(ConfigReader, method)))
    return reads


@pytest.mark.parametrize("kind", known_kinds())
def test_declared_settings_are_what_the_config_parser_reads(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _record_reads(monkeypatch)
    build_committer(kind, _required_config(kind, tmp_path))
    reads.pop("name")  # the sink's name, which onceflow passes in; not a user setting
    declared = {s.key: s for s in sink_kind(kind).settings}
    assert sorted(declared) == sorted(reads), f"{kind}: declared settings differ from the keys read"
    for key, (method, args) in reads.items():
        setting = declared[key]
        required = (
            method in ("path", "string_list")
            or (method == "string" and args["default"] is None)
            or (method == "columns" and args["required"])
        )
        actual = {
            "type": READER_TYPES[method],
            "required": required,
            "default": args.get("default") if method in ("string", "integer", "boolean") else None,
            "minimum": args.get("minimum") or 0,
        }
        declared_as = {
            "type": setting.type,
            "required": setting.required,
            "default": setting.default,
            "minimum": setting.minimum or 0,
        }
        assert declared_as == actual, f"{kind} setting {key!r}"


@pytest.mark.parametrize(
    ("kind", "setting"),
    [(k, s) for k in known_kinds() for s in sink_kind(k).settings if s.choices],
    ids=lambda v: v if isinstance(v, str) else v.key,
)
def test_declared_choices_are_the_accepted_values(kind: str, setting: SinkSetting, tmp_path: Path) -> None:
    config = _required_config(kind, tmp_path)
    for choice in setting.choices:
        build_committer(kind, {**config, setting.key: choice})
    with pytest.raises(ConfigError, match=setting.key):
        build_committer(kind, {**config, setting.key: "no-such-choice"})


def test_update_rewrites_only_what_is_between_the_markers(tmp_path: Path) -> None:
    stale = "\n".join(
        f"<!-- reference:{n} -->\nSTALE TEXT\n<!-- /reference:{n} -->" for n in reference.SECTIONS
    )
    text = f"# intro\n\n{stale}\n\nafter\n"
    updated = reference.update(text)
    assert updated.startswith("# intro\n\n") and updated.endswith("\n\nafter\n")
    assert "STALE TEXT" not in updated
    assert reference.generated_blocks(updated)["sinks"] == reference.render("sinks")
    assert reference.update(updated) == updated
    document = tmp_path / "configuration.md"
    document.write_text(text)
    assert reference.main([str(document), "--check"]) == 1
    assert document.read_text() == text  # --check writes nothing
    assert reference.main([str(document)]) == 0
    assert document.read_text() == updated
    assert reference.main([str(document), "--check"]) == 0


def test_missing_markers_are_named() -> None:
    with pytest.raises(ConfigError, match=r"<!-- reference:pipeline -->"):
        reference.update("no markers here\n")
