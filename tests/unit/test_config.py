"""The deployment's settings: every ONCEFLOW_ variable read in one place, a bad value refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.config import Settings
from onceflow.engine import slice_job, submit
from onceflow.engine.submit import spark_application, submit_command
from onceflow.errors import ConfigError


def test_the_spark_and_executor_variables_are_settings() -> None:
    defaults = Settings.from_env({})
    assert (defaults.spark_jobs, defaults.spark_master, defaults.spark_remote) == (None, "local[2]", None)
    assert (defaults.executor, defaults.pipelines, defaults.json_read) == ("spark", (), "python")
    env = {
        "ONCEFLOW_SPARK_JOBS": "/opt/jobs",
        "ONCEFLOW_SPARK_MASTER": "local[2,3]",
        "ONCEFLOW_SPARK_REMOTE": "sc://127.0.0.1:15002",
        "ONCEFLOW_EXECUTOR": "local",
        "ONCEFLOW_PIPELINES": "a.b:C, d:E,",
        "ONCEFLOW_JSON_READ": "jvm",
    }
    settings = Settings.from_env(env)
    assert settings.spark_jobs == Path("/opt/jobs") and settings.spark_master == "local[2,3]"
    assert settings.spark_remote == "sc://127.0.0.1:15002" and settings.executor == "local"
    assert settings.pipelines == ("a.b:C", "d:E") and settings.json_read == "jvm"
    assert Settings.from_env(settings.as_env()) == settings  # a child process gets the same settings
    assert Settings.from_env(defaults.as_env()) == defaults


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "ONCEFLOW_SPARK_REMOTE",
            "spark://h:7077",
            r"^ONCEFLOW_SPARK_REMOTE='spark://h:7077' is not a Spark",
        ),
        ("ONCEFLOW_EXECUTOR", "yarn", r"^ONCEFLOW_EXECUTOR='yarn': expected one of spark, connect, submit"),
        ("ONCEFLOW_PIPELINES", "a.b:C,nocolon", r"^ONCEFLOW_PIPELINES='a.b:C,nocolon': 'nocolon' is not"),
        ("ONCEFLOW_JSON_READ", "Python", r"^ONCEFLOW_JSON_READ='Python': expected python or jvm$"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(variable: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        Settings.from_env({variable: value})
    assert "\n" not in str(refused.value)


def test_the_entry_point_is_the_configured_folders_else_beside_the_code_else_the_slice_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configured = Settings.from_env({"ONCEFLOW_SPARK_JOBS": str(tmp_path / "jobs")})
    assert spark_application(configured) == str(tmp_path / "jobs" / "onceflow_process.py")
    beside = Settings.from_env({})
    assert spark_application(beside) == str(submit.BESIDE_THE_CODE / "onceflow_process.py")
    assert Path(spark_application(beside)).is_file()  # this checkout has the folder
    monkeypatch.setattr(submit, "BESIDE_THE_CODE", tmp_path / "no_such_folder")  # an installed onceflow
    assert spark_application(beside) == slice_job.__file__


def test_spark_submit_takes_the_master_and_the_entry_point_from_the_settings(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {"ONCEFLOW_SPARK_MASTER": "spark://m:7077", "ONCEFLOW_SPARK_JOBS": str(tmp_path)}
    )
    command = submit_command("p:P", 3, 1, "token", settings)
    assert command[:3] == ["spark-submit", "--master", "spark://m:7077"]
    assert str(tmp_path / "onceflow_process.py") in command
    assert submit_command("p:P", 3, 1, "token", settings, master="local[1]")[2] == "local[1]"
