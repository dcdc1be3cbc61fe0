"""Fixtures of the fault tests: a PostgreSQL connection to read sinks with, and where reports go."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from onceflow.config import Settings

REPORTS = Path(__file__).resolve().parent / "out"


@pytest.fixture
def pg(settings: Settings) -> Iterator[Any]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def reports() -> Path:
    REPORTS.mkdir(exist_ok=True)
    return REPORTS
