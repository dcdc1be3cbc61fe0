"""Fixtures of the integration tests that need more than the stack's connections (tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_stack.spark_runtime import SparkRuntime

from onceflow.config import Settings
from onceflow.ledger import Ledger
from onceflow.storage.s3 import S3Settings
from tests.integration.pipeline_helpers import settings_with_own_ledger
from tests.integration.s3_helpers import BUCKET, empty_prefix


@pytest.fixture
def pg_ledger(pg_database: str) -> Ledger:
    """A ledger in a fresh PostgreSQL database, its schema created. Its URL is a plain postgresql://
    one, as ONCEFLOW_PG_DSN is written: that must work as a ledger URL too."""
    ledger = Ledger.connect(pg_database, check=False)
    ledger.upgrade()
    return ledger


@pytest.fixture(scope="session")
def runtime() -> SparkRuntime:
    """The local warm runtime. Session-scoped, so it is resolved before any test's ``stack`` points
    ONCEFLOW_HOME at a temporary folder."""
    return SparkRuntime.from_env()


@pytest.fixture
def run_settings(tmp_path: Path) -> Settings:
    """The settings of a pipeline run with its own SQLite ledger and home in the test's folder."""
    return settings_with_own_ledger(tmp_path)


@pytest.fixture(scope="module")
def s3(settings: Settings) -> S3Settings:
    """The stack's S3 server; a test that needs it fails, saying why, where its settings are missing."""
    if settings.s3 is None or settings.s3.endpoint_url is None:
        pytest.fail("AWS_ENDPOINT_URL not set: export the stack's settings (its S3 server)", pytrace=False)
    return settings.s3


@pytest.fixture
def bucket_prefix(s3: S3Settings, request: pytest.FixtureRequest) -> Iterator[str]:
    """A prefix of the stack's bucket of this test's own (``s3://bucket/<test>-<uuid>``), emptied
    afterwards."""
    url = f"s3://{BUCKET}/{request.node.name[:40]}-{uuid.uuid4().hex[:10]}"
    yield url
    empty_prefix(s3, url)
