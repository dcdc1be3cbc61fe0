"""The seeds' summary table, observed: each sink kind with a non-replayable and a replayable source,
under one fault schedule of real SIGKILLs. The test asserts that what happened equals the seeds' table."""

from __future__ import annotations

import pytest

from tests.faults import harness

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_observed_guarantees_equal_the_seeds_table(settings, pg, tmp_path, reports) -> None:
    table = harness.consistency_table(tmp_path, settings, pg)
    markdown = harness.table_markdown(table)
    cells = {sink: {src: t.to_dict() for src, t in row.items()} for sink, row in table["cells"].items()}
    harness.write_report(reports, "consistency-table", {**table, "cells": cells}, markdown)
    print("\n" + markdown)
    assert all(all(fired) for fired in table["fired"].values()), table["fired"]
    assert harness.observed_table(table) == harness.SEEDS_TABLE
