"""Secrets hidden from every message: URLs, DSNs and settings rendered without passwords or tokens.

Errors and log lines reach task logs, the ledger (as abort reasons) and the console, so anything that
prints a connection string or a settings mapping goes through here first. What is hidden:

* a URL's userinfo password (``postgresql://user:***@host/db``, also without a scheme: ``user:***@host``),
  percent-encoded or not, and with a raw ``@`` in it: the password runs to the word's last ``@``;
* what a raw ``@`` in a password made a host name, as a client library quotes it (``failed to resolve
  host '***@db'``: a host name never holds an ``@``);
* a bearer token (``Bearer ***``, also ``Bearer%20***`` in a URL);
* the value of any ``key=value`` or ``key: value`` whose key looks secret: URL query parameters
  (``?password=``), libpq key/value DSNs (``password='…'``), Spark Connect parameters (``;token=…``) and
  the items of a printed mapping (``'s3.secret-access-key': '…'``);
* in `mapping`, the values of secret-looking keys, and any URL password inside the other values.

Over-hiding is the safe side: a value that only looks secret is shown as ``***`` too. `text` is the one
function every message, log line and traceback goes through (`url` and `Formatter` are it, named for
where they are used).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

MASK = "***"

# Names of settings whose value is a secret (matched anywhere in a key, case-insensitively).
_SECRET_WORDS = (
    r"passw(?:or)?d|pwd|secret|token|credential|signature|private[-_.]?key|api[-_.]?key"
    r"|access[-_.]?key|account[-_.]?key|session[-_.]?key|connection[-_.]?string|authorization"
)
_SECRET_KEY = re.compile(_SECRET_WORDS, re.IGNORECASE)
# ``scheme://user:password@`` or, at the start of a word, ``user:password@``; the password runs to the
# last ``@`` of the word, as a password with a literal ``@`` in it would.
_USERINFO = re.compile(
    r"(?P<head>(?:[A-Za-z][A-Za-z0-9+.-]*://|(?<![^\s'\"(=,\[{]))[^\s:/@'\"]*:(?!//))(?P<password>[^\s'\"]*)@"
)
# A host name quoted by a client library (psycopg, libpq): what precedes an ``@`` in it is the rest of a
# password that held a raw ``@``.
_HOST = re.compile(r"(?P<head>\bhost(?:\s+name)?\s+['\"])(?P<password>[^\s'\"]*)@", re.IGNORECASE)
# ``Bearer <token>``, as an Authorization header's value is written (``%20`` or ``+`` in a URL).
_BEARER = re.compile(r"(?P<head>\bbearer(?:\s+|%20|\+))(?P<value>[^\s'\"&;,)}\]]+)", re.IGNORECASE)
# ``key=value`` / ``key: value`` with a secret-looking key, the key optionally quoted, the value quoted
# or running to the next separator.
_PAIR = re.compile(
    r"(?P<head>(?<![\w.-])['\"]?[\w.-]*(?:" + _SECRET_WORDS + r")[\w.-]*['\"]?\s*[:=]\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&;,'\")}\]]*)",
    re.IGNORECASE,
)


def secret_key(name: object) -> bool:
    """Whether a setting called ``name`` holds a secret (password, token, secret key, credential…)."""
    return isinstance(name, str) and _SECRET_KEY.search(name) is not None


def _mask_value(match: re.Match[str]) -> str:
    value = match["value"]
    if not value:
        return match[0]
    quote = value[0] if value[0] in "'\"" else ""
    return f"{match['head']}{quote}{MASK}{quote}"


def text(value: object) -> str:
    """``str(value)`` with every URL password and secret-looking ``key=value`` hidden: for any message
    that may quote a URL, a DSN or a library's error about one."""
    rendered = _BEARER.sub(lambda m: f"{m['head']}{MASK}", str(value))
    rendered = _USERINFO.sub(lambda m: f"{m['head']}{MASK}@", rendered)
    rendered = _HOST.sub(lambda m: f"{m['head']}{MASK}@", rendered)
    return _PAIR.sub(_mask_value, rendered)


def url(value: str) -> str:
    """A URL or DSN (SQLAlchemy, libpq key/value, ``sc://``) as it may be shown."""
    return text(value)


def mapping(values: Mapping[Any, Any]) -> dict[Any, Any]:
    """A copy of ``values`` to show: secret-looking keys' values masked, nested mappings likewise, URL
    passwords inside the other string values hidden."""
    return {key: MASK if secret_key(key) else shown(value) for key, value in values.items()}


def shown(value: Any) -> Any:
    """Any config value as it may be shown: mappings through `mapping`, strings through `text`,
    sequences item by item; other values unchanged."""
    if isinstance(value, Mapping):
        return mapping(value)
    if isinstance(value, str):
        return text(value)
    if isinstance(value, list | tuple):
        return type(value)(shown(item) for item in value)
    return value


class Formatter(logging.Formatter):
    """A log formatter whose every line, traceback included, goes through `text`: for the handlers of a
    process that logs library messages (the CLI's ``--debug``)."""

    def format(self, record: logging.LogRecord) -> str:
        return text(super().format(record))


def scrub(exc: BaseException) -> BaseException:
    """``exc`` made fit to be logged with its traceback, for a door (an Airflow task) that logs what it
    raises: the string arguments of it and of its causes go through `text`, and the chain is cut above
    the first cause whose message is not made of its arguments (a driver's error may build it from a
    URL); the result is ``exc`` itself, or, if its own message is of that kind, a `RuntimeError` that
    says what it said."""
    link: BaseException | None = exc
    above: BaseException | None = None
    seen: set[int] = set()
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.args = tuple(text(a) if isinstance(a, str) else a for a in link.args)
        if text(link) != str(link):
            if above is None:
                return RuntimeError(f"{type(exc).__name__}: {text(exc)}")
            above.__cause__, above.__context__, above.__suppress_context__ = None, None, True
            break
        above, link = link, link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    return exc


@contextmanager
def scrubbed() -> Iterator[None]:
    """Re-raise whatever the block raises through `scrub`."""
    try:
        yield
    except Exception as exc:
        clean = scrub(exc)
        if clean is exc:
            raise
        raise clean from None


def dataclass_repr(obj: Any, secret: Callable[[Any], str] = lambda _: MASK) -> str:
    """``Name(field=value, ...)`` of a dataclass instance, with each field whose metadata says
    ``{"secret": True}`` shown through ``secret`` (by default as ``***``) when it holds a value."""
    from dataclasses import fields

    shown = (
        f"{f.name}={secret(value) if f.metadata.get('secret') and value is not None else value!r}"
        for f in fields(obj)
        for value in [getattr(obj, f.name)]
    )
    return f"{type(obj).__name__}({', '.join(shown)})"
