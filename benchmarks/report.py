"""The harness's outputs: results JSON, a Markdown table, a PNG chart, and the machine they describe.

Ratios are *engine time ÷ reference time* per query, the reference being
flight-exec with the most workers (above 1: flight-exec is faster); their
geometric mean is over the queries both engines answered correctly.
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

__all__ = ["chart", "geomean", "load_average", "machine", "markdown", "now_iso", "ratios", "versions", "write_json"]

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
    for dist in ("flight-exec", "pyarrow", "duckdb", "pyspark", "datafusion", "polars", "pysail", "tpchgen-cli"):
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
    """Per-query medians (seconds), ratios to ``reference``, geometric means; then peak RSS; then problems."""
    engines = list(labels)
    by = {(c.query, c.engine): c for c in cells}
    medians = _medians(cells)
    rel = ratios(cells, reference)
    others = [e for e in engines if e != reference]
    ref_label = labels[reference]

    head = ["query", *(labels[e] for e in engines), *(f"{shorts[e]} ÷ {shorts[reference]}" for e in others)]
    lines = [title, "", "| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for n in numbers:
        times = []
        for e in engines:
            c = by.get((n, e))
            times.append(_secs(c.median) if c is not None and c.status == "ok" else f"**{c.status if c else '–'}**")
        lines.append("| " + " | ".join([f"Q{n}", *times, *(_x(rel.get(e, {}).get(n)) for e in others)]) + " |")
    gm_times = [_secs(geomean([medians[(n, e)] for n in numbers if (n, e) in medians])) for e in engines]
    gm_ratios = [_x(geomean(list(rel.get(e, {}).values()))) for e in others]
    lines.append("| " + " | ".join(["**geomean**", *gm_times, *(f"**{r}**" for r in gm_ratios)]) + " |")
    lines += ["", f"Median seconds of the timed runs. Ratios: the engine's time ÷ the time of {ref_label}; "
              f"above 1, {ref_label} is faster. Geometric means over the queries each engine answered correctly."]

    lines += ["", "Peak RSS (MiB, median over the timed runs) of each engine's processes:", "",
              "| query | " + " | ".join(labels[e] for e in engines) + " |", "|---|" + "---:|" * len(engines)]
    for n in numbers:
        row = []
        for e in engines:
            c = by.get((n, e))
            peak = c.median_peak_rss if c is not None else None
            row.append("–" if peak is None else f"{peak / _MIB:,.0f}")
        lines.append(f"| Q{n} | " + " | ".join(row) + " |")

    problems = [c for c in cells if c.status != "ok"]
    lines.append("")
    if problems:
        lines.append("**Problems:**")
        lines += [f"- Q{c.query} on {labels.get(c.engine, c.engine)}: {c.status}: {_first_line(c.problem)}" for c in problems]
    else:
        lines.append(f"Every result of every engine matches DuckDB's ({len(cells)} query × engine cells).")
    return "\n".join(lines) + "\n"


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
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / max(1, len(engines))
    colors = plt.get_cmap("tab10").colors
    for i, e in enumerate(engines):
        xs = [j + (i - (len(engines) - 1) / 2) * width for j in range(len(numbers))]
        ys = [medians.get((n, e), math.nan) for n in numbers]
        left.bar(xs, ys, width, label=labels[e], color=colors[i % len(colors)])
    left.set_xticks(range(len(numbers)), [f"Q{n}" for n in numbers])
    left.set_yscale("log")
    left.set_ylabel("median seconds (log scale)")
    left.legend(fontsize="small")
    left.grid(axis="y", which="both", alpha=0.3)
    left.set_title("per query, lower is better")

    gms = [geomean(list(rel.get(e, {}).values())) or math.nan for e in others]
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
    right.set_ylabel(f"geomean of engine time ÷ {shorts[reference]} time")
    right.set_title(f"above 1: {shorts[reference]} is faster")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).astimezone().isoformat(timespec="seconds")
