"""bench/report.md keeps the sections other bench scripts wrote into it when the main report is redone."""

from __future__ import annotations

from bench.report import kept_sections

ICEBERG = "<!-- iceberg-bench -->\n## Iceberg commit\n| 10^4 | 0.010 s |\n<!-- /iceberg-bench -->\n"


def test_a_marked_section_survives_a_new_report_that_lacks_it() -> None:
    previous = "# onceflow benchmarks\n\nold figures\n\n" + ICEBERG
    assert kept_sections(previous, "# onceflow benchmarks\n\nnew figures\n").strip() == ICEBERG.strip()


def test_a_section_the_new_report_has_is_not_doubled_and_nothing_else_is_kept() -> None:
    assert kept_sections("# old\n\n" + ICEBERG, "# new\n" + ICEBERG) == ""
    assert kept_sections("# old report without sections\n", "# new\n") == ""
