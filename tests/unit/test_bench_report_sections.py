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


def test_cpu_between_two_looks_counts_a_process_that_exits_once() -> None:
    from bench.spark_jobs import cpu_spent

    before = {"executor Python workers": {10: 5.0, 11: 2.0, -1: 1.0}, "driver": {1: 3.0}}
    # Worker 11 ran 0.5 s more, exited and was reaped: its 2.5 s are now under its executor (-1). Worker
    # 10 ran 1 s, worker 12 is new and ran 0.5 s.
    after = {"executor Python workers": {10: 6.0, 12: 0.5, -1: 3.5}, "driver": {1: 3.25}}
    assert cpu_spent(before, after) == {"executor Python workers": 2.0, "driver": 0.25}


def test_the_sustained_targets_hold_for_the_postgresql_pipeline_too() -> None:
    """Each ratio target is checked for the files and the PostgreSQL two-phase pipeline, each with its
    own verdict: a fast files pipeline does not carry a slower PostgreSQL one."""
    from bench.report import targets

    rate = {"records_per_s": 0.0}
    round_ = {
        "limit": rate | {"records_per_s": 150_000.0},
        "files": rate | {"records_per_s": 210_000.0},
        "postgres_2pc": rate | {"records_per_s": 170_000.0},
        "spark_structured_streaming": rate | {"records_per_s": 150_000.0},
        "quix_streams": rate | {"records_per_s": 60_000.0},
    }
    rows = {target: verdict for target, _, verdict in targets({"throughput": {"10000000": [round_]}})}
    assert rows["pipeline ≥ 1.2× Spark Structured Streaming at 10^7 records"] == "met"
    assert rows["PostgreSQL two-phase pipeline ≥ 1.2× Spark Structured Streaming at 10^7 records"] == "MISSED"
    assert rows["PostgreSQL two-phase pipeline ≥ 0.6× the limit at 10^7 records"] == "met"
    assert rows["PostgreSQL two-phase pipeline ≥ 1.2× quix-streams at 10^7 records"] == "met"
