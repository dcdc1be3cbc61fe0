"""``onceflow topics create``: its arguments, and the one line each bad input or unreachable Kafka gives
(the cases that need a broker, an existing topic with the same or another partition count, are in
tests/integration/test_readme_pipeline.py)."""

from __future__ import annotations

import pytest

from onceflow.cli.main import EXIT_ERROR, main
from onceflow.cli.topics import parse_configs

NO_KAFKA = "127.0.0.1:1"  # nothing listens on port 1


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("onceflow: error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["topics", "create", "t", "--partitions", "0"], "--partitions: expected an integer >= 1, got '0'"),
        (
            ["topics", "create", "t", "--partitions", "two"],
            "--partitions: expected an integer >= 1, got 'two'",
        ),
        (["topics", "create", "t"], "the following arguments are required: --partitions"),
        (["topics", "create", "--partitions", "1"], "the following arguments are required: name"),
        (["topics"], "the following arguments are required: topics_command"),
        (["topics", "create", "t", "--partitions", "1", "--replication-factor", "0"], "--replication-factor"),
    ],
)
def test_bad_usage_exits_2_naming_the_argument(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["topics", "create", "no spaces", "--partitions", "1"],
            "onceflow: error: topic name 'no spaces': expected letters, digits, '.', '_' or '-', at most 249",
        ),
        (
            ["topics", "create", "t", "--partitions", "1", "--config", "retention.ms"],
            "onceflow: error: --config 'retention.ms': expected KEY=VALUE, e.g. retention.ms=604800000",
        ),
    ],
)
def test_bad_input_is_one_line_before_anything_connects(
    args: list[str], line: str, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP", NO_KAFKA)
    assert main(args) == EXIT_ERROR
    out, err = capfd.readouterr()
    assert _one_error_line(err) == line
    assert out == ""


def test_unreachable_kafka_is_one_line_naming_the_setting_without_client_noise(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP", NO_KAFKA)
    monkeypatch.delenv("ONCEFLOW_DEBUG", raising=False)
    assert main(["topics", "create", "t", "--partitions", "1", "--timeout", "1"]) == EXIT_ERROR
    line = _one_error_line(capfd.readouterr().err)  # capfd: librdkafka writes to fd 2 directly
    assert line.startswith(f"onceflow: error: Kafka at {NO_KAFKA} did not answer within 1 s (")
    assert "ONCEFLOW_KAFKA_BOOTSTRAP" in line and "make services" in line


def test_configs_are_key_value_pairs() -> None:
    assert parse_configs(["retention.ms=-1", " cleanup.policy = compact "]) == {
        "retention.ms": "-1",
        "cleanup.policy": "compact",
    }
    assert parse_configs([]) == {}
