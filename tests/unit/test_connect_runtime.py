"""The Spark Connect client's pure parts: which runner, which remote, which modules ship, tags, reasons."""

from __future__ import annotations

import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from onceflow.config import Settings
from onceflow.engine.connect import (
    module_bundle,
    own_packages,
    pipeline_modules,
    slice_tag,
)
from onceflow.engine.executors import slice_runner
from onceflow.errors import ConfigError
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec


def _spec(**changes: object) -> Pipeline:
    spec = Pipeline(
        name="p",
        source=KafkaSource(topics=("t",)),
        format=JsonFormat(schema={"id": "int"}),
        transform="shop.transforms:clean",
        sinks=(SinkSpec("out", "plain", {"table": "t", "columns": {"id": "bigint"}}),),
    )
    return replace(spec, **changes)


def test_spark_means_connect_when_a_remote_is_set_and_spark_submit_otherwise() -> None:
    assert slice_runner("spark", "sc://127.0.0.1:15002") == "connect"
    assert slice_runner("spark", None) == "submit"
    assert slice_runner("submit", "sc://127.0.0.1:15002") == "submit"
    assert slice_runner("local", "sc://127.0.0.1:15002") == "local"
    assert slice_runner("connect", "sc://h:1") == "connect"
    with pytest.raises(ConfigError, match="ONCEFLOW_SPARK_REMOTE"):
        slice_runner("connect", None)


def test_the_remote_comes_from_the_environment_and_must_be_a_spark_connect_url() -> None:
    def spark_remote(env: dict[str, str]) -> str | None:
        return Settings.from_env(env).spark_remote

    assert spark_remote({}) is None
    assert spark_remote({"ONCEFLOW_SPARK_REMOTE": " "}) is None
    assert spark_remote({"ONCEFLOW_SPARK_REMOTE": "sc://127.0.0.1:15002"}) == "sc://127.0.0.1:15002"
    with pytest.raises(ConfigError, match="sc://host:port"):
        spark_remote({"ONCEFLOW_SPARK_REMOTE": "http://127.0.0.1:15002"})


def test_a_slice_tag_is_a_valid_spark_tag_and_differs_per_attempt() -> None:
    tag = slice_tag("orders, eu/west", 7, 1, "a1b2c3d4e5f6a7b8")
    assert "," not in tag and tag.startswith("onceflow-orders__eu_west-e7-s1-")
    assert slice_tag("orders", 7, 1, "aaaaaaaaaaaa") != slice_tag("orders", 7, 1, "bbbbbbbbbbbb")
    assert slice_tag("orders", 7, 1, "aaaaaaaaaaaa") != slice_tag("orders", 7, 2, "aaaaaaaaaaaa")


def test_the_pipelines_own_modules_are_named_and_onceflows_are_not() -> None:
    spec = _spec(sinks=(SinkSpec("out", "shop.sinks:AUDIT", {}), SinkSpec("pg", "postgres_2pc", {})))
    assert pipeline_modules(spec, "shop.specs:ORDERS") == ["shop.specs", "shop.transforms", "shop.sinks"]
    assert pipeline_modules(_spec(transform="onceflow.testing:identity"), "onceflow.x:P") == []
    assert pipeline_modules(_spec(transform=None)) == []


def test_a_bundle_holds_the_packages_sources_and_is_named_by_content(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "src"
    (source / "shopx" / "inner").mkdir(parents=True)
    (source / "shopx" / "__init__.py").write_text("")
    (source / "shopx" / "inner" / "__init__.py").write_text("")
    (source / "shopx" / "inner" / "spec.py").write_text("import lonely_x\nP = 1\n")
    (source / "shopx" / "__pycache__").mkdir()
    (source / "shopx" / "__pycache__" / "stale.py").write_text("")
    (source / "lonely_x.py").write_text("import json\nX = json.dumps(1)\n")
    monkeypatch.syspath_prepend(str(source))

    # The spec's package, and what it imports that is not installed (json is; onceflow is).
    assert own_packages(["shopx.inner.spec"]) == ["shopx", "lonely_x"]
    first = module_bundle(["shopx", "lonely_x"], tmp_path / "out")
    assert first is not None
    with zipfile.ZipFile(first) as bundle:
        assert sorted(bundle.namelist()) == [
            "lonely_x.py",
            "shopx/__init__.py",
            "shopx/inner/__init__.py",
            "shopx/inner/spec.py",
        ]
    assert module_bundle(["shopx", "lonely_x"], tmp_path / "again") is not None
    assert (tmp_path / "again" / first.name).read_bytes() == first.read_bytes()
    (source / "lonely_x.py").write_text("X = 2\n")
    changed = module_bundle(["shopx", "lonely_x"], tmp_path / "out")
    assert changed is not None and changed.name != first.name
    assert module_bundle([], tmp_path / "out") is None


def test_a_spark_submit_child_never_inherits_spark_connect_mode(tmp_path: Path) -> None:
    """pyspark marks a process that opened a Connect session as Connect mode; its spark-submit children
    must still start classic drivers."""
    from onceflow.config import Settings
    from onceflow.engine.submit import spark_environment

    base = {"PATH": "/bin", "SPARK_CONNECT_MODE_ENABLED": "1", "SPARK_REMOTE": "sc://h:1", "KEEP": "x"}
    env = spark_environment(Settings.from_env({"ONCEFLOW_HOME": str(tmp_path)}), base)
    assert "SPARK_CONNECT_MODE_ENABLED" not in env and "SPARK_REMOTE" not in env
    assert env["KEEP"] == "x"
