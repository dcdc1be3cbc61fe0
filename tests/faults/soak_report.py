"""The soak's report: JSON for machines, markdown for people, and a PNG of the sampled resources.

The plot needs matplotlib (the ``bench`` extra, which `make soak` installs); without it the markdown
says so and the JSON still holds every sample.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.faults.harness import write_report

# Panels of the plot: (title, curve name prefixes of `soak_resources.curves`).
PANELS = (
    ("Prepared transactions (soak's pipelines)", ("prepared",)),
    ("Staged bytes", ("staging_bytes",)),
    ("Open Kafka transactions", ("kafka_open_sink", "kafka_open_workload")),
    ("Ledger rows", ("ledger_rows",)),
    ("Open files and sockets", ("fds.", "sockets.")),
    ("Resident memory (MB)", ("rss_mb.",)),
    ("Spark runtime, proportional set size (MB)", ("runtime_pss_mb.", "runtime_pss_total_mb")),
    ("Spark runtime: Python processes, Connect sessions", ("python_processes", "sessions")),
    ("Backlog per pipeline (offsets still to read)", ("backlog.",)),
)
FAULT_COLOURS = {"crash": "tab:red", "kafka_restart": "tab:blue", "postgres_restart": "tab:green"}
STEPS = ("plan", "process", "commit")
# The line `tests.faults.invariants` writes for a record that comes before one of lower offset.
INVERSION = re.compile(r": source partition \d+ offset \d+ after \d+$")
SPARK_COLOUR = "tab:orange"  # the Spark kinds; the cluster kinds are purple


def markdown(data: Mapping[str, Any]) -> str:
    verdict, resources = data["verdict"], data["resources"]
    ok = not verdict["violations"] and not resources["unbounded"] and not data["error"]
    lines = [
        f"Soak, seed {data['seed']}: {data['minutes']:g} minutes at {data['rate_per_s']} records/s "
        f"({data.get('sustained_per_s', data['rate_per_s']):g} sustained), "
        f"{data['brokers']} Kafka broker(s), {data['seconds']:.0f} s in all: "
        f"{'PASSED' if ok else 'FAILED'}.",
        "",
        f"Records: {data['records']['good']} good, {data['records']['aborted']} in aborted transactions, "
        f"{data['records']['bad']} bad ({data['records']['producer_transactions']} producer transactions, "
        f"{len(data['records']['producer_errors'])} producer errors). Lost {verdict['lost']}, duplicated "
        f"{verdict['duplicated_exactly_once']} in exactly-once sinks "
        f"({verdict['duplicated_at_least_once']} in the at-least-once plain and WAL sinks, as they may), "
        f"aborted reads {verdict['aborted_read']}.",
    ]
    inversions = [v for v in verdict["violations"] if INVERSION.search(v)]
    lines += [
        "",
        f"Order: {len(inversions)} inversions of a source partition's offsets among the records of the "
        "Kafka output (per output partition) and the rows of the files, Iceberg and Delta sinks (per "
        "committed data file).",
    ]
    if data["error"]:
        lines += ["", f"The run stopped early: `{data['error'][:500]}`"]
    lines += [
        "",
        "| pipeline | executor | sinks | epochs committed | empty | failed | mean epoch s "
        "(plan / process / commit) | offsets/s in clean epochs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, lane in data["lanes"].items():
        sinks = ", ".join(f"{s} ({k})" for s, k in lane["sinks"].items())
        sinks += ", keyed state" if lane["keyed_state"] else ""
        lines.append(
            f"| {name} | {lane['executor']} | {sinks} | {lane['epochs_committed']} | "
            f"{lane['epochs_empty']} | {lane['epochs_failed']} | {lane['clean_epoch_mean_s']} "
            f"({' / '.join(str(lane.get('clean_step_mean_s', {}).get(s, '-')) for s in STEPS)}) | "
            f"{lane.get('clean_offsets_per_s', '-')} |"
        )
    lines += ["", "| pipeline | sink | expected | delivered | lost | duplicated | aborted read |"]
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for name, lane in verdict["lanes"].items():
        for t in lane["tallies"]:
            lines.append(
                f"| {name} | {t['sink']} | {t['expected']} | {t['delivered']} | {t['lost']} | "
                f"{t['duplicates']} | {t['unexpected']} |"
            )
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(data["faults_per_kind"].items()))
    lines += ["", f"Faults: {len(data['faults'])} ({kinds}); {data['faults_fired']} landed where aimed."]
    lines += [
        "",
        "| # | minute | kind | pipeline | fault | landed | exits | s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in data["faults"]:
        lines.append(
            f"| {f['number']} | {f['minute']:.1f} | {f['kind']} | {f['lane']} | {f['detail']} | "
            f"{'yes' if f['fired'] else 'no'} | {', '.join(f['exits'])} | {f['seconds']:.0f} |"
        )
    lines += [
        "",
        f"Resources, sampled every minute between steps (retention keeps "
        f"{resources['retain_epochs']} committed epochs and dead letters for "
        f"{resources['dead_letter_minutes']:g} minutes):",
        "",
        "| curve | min | max | first | last | second-half slope /min |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, c in resources["summary"].items():
        lines.append(
            f"| {name} | {c['min']:g} | {c['max']:g} | {c['first']:g} | {c['last']:g} | "
            f"{c['second_half_slope_per_min']:g} |"
        )
    lines += ["", "Bounded: " + ("yes" if not resources["unbounded"] else "; ".join(resources["unbounded"]))]
    lines += [
        "",
        "Violations: " + ("none" if not verdict["violations"] else "; ".join(verdict["violations"])),
    ]
    if data["not_wired"]:
        lines += ["", "Not in this run: " + "; ".join(data["not_wired"])]
    lines += ["", f"![resources](soak-{data['seed']}.png)"]
    return "\n".join(lines)


def plot(data: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = data["resources"]["samples"]
    minutes = [s["minute"] for s in samples]
    fig, axes = plt.subplots(3, 3, figsize=(16, 12), sharex=True)
    for ax, (title, prefixes) in zip(axes.flat, PANELS, strict=True):
        for key in prefixes:
            for name, values in _series(samples, key).items():
                ax.plot(minutes, values, marker=".", label=name)
        for f in data["faults"]:
            colour = FAULT_COLOURS.get(
                f["kind"], SPARK_COLOUR if f["kind"].startswith(("spark", "runner")) else "tab:purple"
            )
            ax.axvline(f["minute"], color=colour, alpha=0.25, linewidth=1)
        ax.set(title=title, xlabel="minute")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(
        f"Soak seed {data['seed']}: faults as vertical lines (red crash, blue Kafka, green PostgreSQL, "
        "orange Spark, purple Kafka cluster)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _series(samples: list[dict[str, Any]], key: str) -> dict[str, list[float]]:
    if not key.endswith("."):
        if key == "ledger_rows":
            tables = sorted({t for s in samples for t in s["ledger_rows"]})
            found = {t: [s["ledger_rows"].get(t, float("nan")) for s in samples] for t in tables}
            return {"total": [s["ledger_total"] for s in samples], **found}
        return {key: [s[key] for s in samples]}
    field = key[:-1]
    names = sorted({n for s in samples for n in s[field]})
    return {n: [s[field].get(n, float("nan")) for s in samples] for n in names}


def write(out: Path, name: str, data: Mapping[str, Any]) -> Path:
    """``name``.json, ``name``.md and, with matplotlib, ``name``.png under ``out``."""
    text = markdown(data)
    out.mkdir(parents=True, exist_ok=True)
    try:
        plot(data, out / f"{name}.png")
    except ImportError:
        text = text.replace(
            f"![resources]({name}.png)", "(no plot: install the `bench` extra for matplotlib)"
        )
    return write_report(out, name, data, text)
