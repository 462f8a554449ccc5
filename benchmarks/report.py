"""The harness's outputs: results JSON, a Markdown table, a PNG chart, and the machine they describe.

Ratios are *engine time ÷ reference time* per query, the reference being
flight-exec with the most workers (above 1: flight-exec is faster).

Geometric means: the table's **geomean** row (and the chart's right panel, and the JSON's
``geomean_common``) is over the queries *every* engine of the run answered correctly, their count
stated: then each column's mean is over the same queries, so the columns compare. When some engine
missed some queries (TPC-DS: an engine that cannot run a text, or answers wrongly), a second row
gives each engine's own: its times over the queries it answered, its ratio over those it and the
reference both answered (the rule of the JSON's ``geomean_ratio``).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path

from benchmarks.suite import Cell

__all__ = [
    "answered",
    "chart",
    "common_queries",
    "geomean",
    "load_average",
    "machine",
    "markdown",
    "now_iso",
    "ratios",
    "versions",
    "write_json",
]

_MIB = 1 << 20


def machine() -> dict[str, object]:
    """Cores, CPU model, memory and OS of this machine."""
    info: dict[str, object] = {"cores": os.cpu_count(), "platform": platform.platform(), "machine": platform.machine()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_bytes"] = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    return info


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: how busy the machine was (other work skews timings)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _java_version() -> str | None:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    first = (out.stderr or out.stdout).strip().splitlines()
    return first[0] if first else None


def versions(with_java: bool) -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("flight-exec", "pyarrow", "duckdb", "pyspark", "datafusion", "polars", "pysail", "tpchgen-cli", "sqlglot"):
        found[dist] = _dist_version(dist)
    if with_java:
        found["java"] = _java_version()
    return found


def write_json(path: Path, payload: Mapping[str, object]) -> None:
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


# ------------------------------------------------------------------ figures


def geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _medians(cells: Sequence[Cell]) -> dict[tuple[int, str], float]:
    """Medians of the cells whose results are right (a wrong answer's time means nothing)."""
    return {(c.query, c.engine): c.median for c in cells if c.status == "ok" and c.median is not None}


def common_queries(cells: Sequence[Cell], engines: Sequence[str], numbers: Sequence[int]) -> list[int]:
    """The queries of ``numbers`` every one of ``engines`` answered correctly: what the geomean row is over."""
    medians = _medians(cells)
    return [n for n in numbers if all((n, e) in medians for e in engines)]


def answered(cells: Sequence[Cell]) -> dict[str, dict[str, int]]:
    """``{engine: {status: count}}``: how many of its cells are ``ok``, ``mismatch``, ``error``, ``unsupported``."""
    out: dict[str, dict[str, int]] = {}
    for c in cells:
        counts = out.setdefault(c.engine, {})
        counts[c.status] = counts.get(c.status, 0) + 1
    return out


def ratios(cells: Sequence[Cell], reference: str) -> dict[str, dict[int, float]]:
    """``{engine: {query: engine median / reference median}}`` for every engine but the reference."""
    medians = _medians(cells)
    out: dict[str, dict[int, float]] = {}
    for (n, engine), t in medians.items():
        ref = medians.get((n, reference))
        if engine != reference and ref:
            out.setdefault(engine, {})[n] = t / ref
    return out


def _secs(t: float | None) -> str:
    if t is None:
        return "–"
    return f"{t:.3f}" if t < 10 else f"{t:.2f}"


def _x(r: float | None) -> str:
    return "–" if r is None else f"{r:.2f}×"


def markdown(cells: Sequence[Cell], labels: Mapping[str, str], shorts: Mapping[str, str], numbers: Sequence[int],
             reference: str, title: str) -> str:
    """Per-query medians (seconds), ratios to ``reference``, geometric means; how many answers each engine got
    right; then peak RSS; then problems."""
    engines = list(labels)
    by = {(c.query, c.engine): c for c in cells}
    medians = _medians(cells)
    rel = ratios(cells, reference)
    others = [e for e in engines if e != reference]
    ref_label = labels[reference]
    common = common_queries(cells, engines, numbers)

    head = ["query", *(labels[e] for e in engines), *(f"{shorts[e]} ÷ {shorts[reference]}" for e in others)]
    lines = [title, "", "| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for n in numbers:
        times = []
        for e in engines:
            c = by.get((n, e))
            times.append(_secs(c.median) if c is not None and c.status == "ok" else f"**{c.status if c else '–'}**")
        lines.append("| " + " | ".join([f"Q{n}", *times, *(_x(rel.get(e, {}).get(n)) for e in others)]) + " |")
    gm_times = [_secs(geomean([medians[(n, e)] for n in common])) for e in engines]
    gm_ratios = [_x(geomean([rel[e][n] for n in common])) if e in rel else _x(None) for e in others]
    which = f"all {len(numbers)}" if len(common) == len(numbers) else f"{len(common)} of {len(numbers)} queries"
    lines.append("| " + " | ".join([f"**geomean** ({which})", *gm_times, *(f"**{r}**" for r in gm_ratios)]) + " |")
    if len(common) < len(numbers):
        own_times = []
        for e in engines:
            mine = [medians[(n, e)] for n in numbers if (n, e) in medians]
            own_times.append(f"{_secs(geomean(mine))} ({len(mine)})")
        own_ratios = [f"{_x(geomean(list(rel.get(e, {}).values())))} ({len(rel.get(e, {}))})" for e in others]
        lines.append("| " + " | ".join(["geomean, each engine's own", *own_times, *own_ratios]) + " |")
    lines += ["", f"Median seconds of the timed runs. Ratios: the engine's time ÷ the time of {ref_label}; "
              f"above 1, {ref_label} is faster. **geomean**: geometric means over the {len(common)} queries "
              "every engine answered correctly."]
    if len(common) < len(numbers):
        lines[-1] += (" Each engine's own: its times over the queries it answered correctly, its ratio over "
                      f"those it and {ref_label} both answered (how many in parentheses).")
    counts = answered(cells)
    lines += ["", "Answers that match DuckDB's: " + "; ".join(
        f"{labels[e]} {counts.get(e, {}).get('ok', 0)} of {len(numbers)}" + _tally(counts.get(e, {})) for e in engines) + "."]

    lines += ["", "Peak RSS (MiB, median over the timed runs) of each engine's processes:", "",
              "| query | " + " | ".join(labels[e] for e in engines) + " |", "|---|" + "---:|" * len(engines)]
    for n in numbers:
        row = []
        for e in engines:
            c = by.get((n, e))
            peak = c.median_peak_rss if c is not None else None
            row.append("–" if peak is None else f"{peak / _MIB:,.0f}")
        lines.append(f"| Q{n} | " + " | ".join(row) + " |")

    problems = [c for c in cells if c.status not in ("ok", "unsupported")]
    refused = [c for c in cells if c.status == "unsupported"]
    lines.append("")
    if problems:
        lines.append("**Problems:**")
        lines += [f"- Q{c.query} on {labels.get(c.engine, c.engine)}: {c.status}: {_first_line(c.problem)}" for c in problems]
    else:
        lines.append(f"Every result of every engine matches DuckDB's ({len(cells) - len(refused)} query × engine cells"
                     + (f"; {len(refused)} the engine cannot run, below" if refused else "") + ").")
    if refused:
        lines += ["", "Not run (the engine refuses the query's text):"]
        lines += [f"- Q{c.query} on {labels.get(c.engine, c.engine)}: {_first_line(c.problem)}" for c in refused]
    return "\n".join(lines) + "\n"


def _tally(counts: Mapping[str, int]) -> str:
    rest = [f"{counts[s]} {s}" for s in ("mismatch", "error", "unsupported") if counts.get(s)]
    return f" ({', '.join(rest)})" if rest else ""


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if text else ""


def chart(cells: Sequence[Cell], labels: Mapping[str, str], shorts: Mapping[str, str], numbers: Sequence[int],
          reference: str, title: str, path: Path) -> None:
    """Left: median seconds per query and engine (log scale). Right: geometric mean of each engine ÷ the reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    engines = list(labels)
    medians = _medians(cells)
    rel = ratios(cells, reference)
    others = [e for e in engines if e != reference]
    common = common_queries(cells, engines, numbers)
    many = len(numbers) > 30
    if not many:  # TPC-H's 22: the per-query bars and the geomeans side by side
        fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 1]})
    else:  # TPC-DS's 99: the per-query bars across the top, wide enough to tell apart; the geomeans below
        fig = plt.figure(figsize=(max(13.0, 0.06 * len(numbers) * len(engines)), 10))
        grid = fig.add_gridspec(2, 4, height_ratios=[3, 2])
        left, right = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0])
    width = 0.8 / max(1, len(engines))
    colors = plt.get_cmap("tab10").colors
    for i, e in enumerate(engines):
        xs = [j + (i - (len(engines) - 1) / 2) * width for j in range(len(numbers))]
        ys = [medians.get((n, e), math.nan) for n in numbers]
        left.bar(xs, ys, width, label=labels[e], color=colors[i % len(colors)])
    left.set_xticks(range(len(numbers)), [f"Q{n}" for n in numbers], rotation=90 if many else 0,
                    fontsize="small" if many else None)
    left.set_xlim(-0.6, len(numbers) - 0.4)
    left.set_yscale("log")
    left.set_ylabel("median seconds (log scale)")
    left.legend(fontsize="small")
    left.grid(axis="y", which="both", alpha=0.3)
    left.set_title("per query, lower is better")

    gms = [(geomean([rel[e][n] for n in common]) if e in rel else None) or math.nan for e in others]
    # Bars grow from 1 (as fast as flight-exec), up when the engine is slower, down when it is faster.
    bars = right.bar(range(len(others)), [g - 1 for g in gms], bottom=1.0,
                     color=[colors[engines.index(e) % len(colors)] for e in others])
    right.bar_label(bars, labels=[_x(g) if not math.isnan(g) else "" for g in gms])
    right.set_yscale("log")
    right.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
    right.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    finite = [g for g in gms if not math.isnan(g)] or [1.0]
    right.set_ylim(min(0.8, min(finite) / 1.5), max(1.25, max(finite) * 1.5))
    right.axhline(1.0, color="black", linewidth=1)
    right.set_xticks(range(len(others)), [labels[e] for e in others], rotation=20, ha="right", fontsize="small")
    right.set_ylabel(f"geomean of engine time ÷ {shorts[reference]} time ({len(common)} queries)")
    right.set_title(f"above 1: {shorts[reference]} is faster")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).astimezone().isoformat(timespec="seconds")
