"""`redact.text` hides a password in every form a URL carries it, wherever the URL is quoted: alone, in a
message, as SQLAlchemy renders it, and in what a driver makes of a password with a raw '@'."""

from __future__ import annotations

import logging
import traceback
import urllib.parse

import pytest

from onceflow import redact
from onceflow.config import Settings
from onceflow.errors import ConfigError

PW = "s3cr3t-PW-1234"
ENCODED = urllib.parse.quote(f"{PW}/:@#", safe="")
FORMS = {
    "userinfo": f"postgresql+psycopg://onceflow:{PW}@db:5432/x",
    "query": f"postgresql+psycopg://onceflow@db:5432/x?sslmode=require&password={PW}",
    "percent-encoded": f"postgresql+psycopg://onceflow:{ENCODED}@db:5432/x",
    "raw @": f"postgresql+psycopg://onceflow:p@{PW}@db:5432/x",
}


def _leaks(shown: str) -> bool:
    return PW in shown or ENCODED in shown or "p@" + PW in shown


@pytest.mark.parametrize("url", FORMS.values(), ids=FORMS.keys())
@pytest.mark.parametrize(
    "quoted",
    [
        "{}",
        "cannot open the ledger at {} (refused): check ONCEFLOW_LEDGER_URL",
        "ONCEFLOW_LEDGER_URL='{}': expected",
        '{{"url": "{}"}}',
        "(url={})",
    ],
)
def test_a_password_in_any_form_is_hidden_wherever_the_url_is_quoted(url: str, quoted: str) -> None:
    shown = redact.text(quoted.format(url))
    assert not _leaks(shown), shown
    assert "db:5432/x" in shown  # where it points stays readable


@pytest.mark.parametrize("url", FORMS.values(), ids=FORMS.keys())
def test_sqlalchemys_own_rendering_is_hidden_too(url: str) -> None:
    from sqlalchemy.engine import make_url

    for rendered in (make_url(url).render_as_string(hide_password=True), repr(make_url(url))):
        assert not _leaks(redact.text(rendered)), rendered


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        (f"failed to resolve host '{PW}@db': [Errno -2]", "failed to resolve host '***@db': [Errno -2]"),
        (f'no host name "x@{PW}@db" to address', 'no host name "***@db" to address'),
        (f"authorization: Bearer {PW}", "authorization: *** ***"),
        (
            f"sc://spark-connect:15002/;authorization=Bearer%20{PW};user_id=a",
            "sc://spark-connect:15002/;authorization=***;user_id=a",
        ),
        (f"header Bearer {PW}.", "header Bearer ***"),
    ],
)
def test_what_a_driver_or_a_header_makes_of_a_secret_is_hidden(message: str, shown: str) -> None:
    assert redact.text(message) == shown


@pytest.mark.parametrize("plain", ["user@example.org wrote", "host 'db' is down", "sc://localhost:15002"])
def test_plain_text_stays(plain: str) -> None:
    assert redact.text(plain) == plain


def test_a_raw_at_in_a_settings_password_is_refused_without_showing_it() -> None:
    for variable in ("ONCEFLOW_PG_DSN", "ONCEFLOW_LEDGER_URL"):
        with pytest.raises(ConfigError) as refused:
            Settings.from_env({variable: f"postgresql://onceflow:p@{PW}@db/x"})
        assert "raw '@'" in str(refused.value) and "%40" in str(refused.value)
        assert not _leaks(str(refused.value)), refused.value
    encoded = Settings.from_env({"ONCEFLOW_PG_DSN": f"postgresql://onceflow:p%40{PW}@db/x?a=b@c"})
    assert encoded.pg_dsn.endswith("@db/x?a=b@c")


def _chained(url: str) -> Exception:
    """A onceflow error raised from a driver's error that quotes the password, as a traceback shows."""
    try:
        try:
            raise OSError(f"failed to resolve host '{url.split('@', 1)[-1]}' for {url}")
        except OSError as exc:
            raise ConfigError(f"cannot open {url} ({exc})") from exc
    except ConfigError as exc:
        return exc


@pytest.mark.parametrize("url", FORMS.values(), ids=FORMS.keys())
def test_an_error_and_its_causes_are_scrubbed_before_a_door_logs_them(url: str) -> None:
    exc = _chained(url)
    clean = redact.scrub(exc)
    shown = "".join(traceback.format_exception(clean))
    assert clean is exc and not _leaks(shown), shown
    assert "OSError" in shown  # the cause is kept where its message could be mended


def test_an_error_whose_message_is_not_its_arguments_is_replaced() -> None:
    class Quoting(Exception):
        def __str__(self) -> str:
            return f"cannot reach {FORMS['userinfo']}"

    clean = redact.scrub(Quoting())
    assert isinstance(clean, RuntimeError) and "Quoting: cannot reach" in str(clean)
    assert not _leaks("".join(traceback.format_exception(clean)))
    with pytest.raises(RuntimeError), redact.scrubbed():
        raise Quoting()


def test_the_formatter_hides_passwords_in_lines_and_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "opening %s", (FORMS["query"],), None)
    exc = _chained(FORMS["raw @"])
    record.exc_info = (type(exc), exc, exc.__traceback__)
    shown = redact.Formatter("%(message)s").format(record)
    assert "opening postgresql+psycopg://onceflow@db:5432/x" in shown and "Traceback" in shown
    assert not _leaks(shown), shown
