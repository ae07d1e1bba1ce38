"""PNG of a benchmark report: ratios against their targets, and per-case throughput."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_plot(report: dict[str, Any], path: Path) -> bool:
    """Write the chart; return False (and write nothing) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False

    ratios: dict[str, float | None] = report["ratios"]
    targets: dict[str, float] = report["ratio_targets"]
    cases: dict[str, dict[str, Any]] = report["cases"]
    meta = report["meta"]

    fig, (ax_r, ax_t) = plt.subplots(
        2,
        1,
        figsize=(10, 3.2 + 0.45 * (len(ratios) + len(cases))),
        gridspec_kw={"height_ratios": [max(len(ratios), 1), max(len(cases), 1)]},
    )

    # -- ratios vs targets (log scale: targets span 0.5 .. 5) --
    keys = list(ratios)
    ys = list(range(len(keys)))[::-1]
    known = [v for v in ratios.values() if v]
    lo = min([*known, *targets.values(), 0.5]) / 2
    hi = max([*known, *targets.values(), 1.0]) * 2
    ax_r.set_xscale("log")
    ax_r.set_xlim(lo, hi)
    ax_r.axvline(1.0, color="0.6", linewidth=0.8, linestyle=":")
    for y, key in zip(ys, keys, strict=True):
        value, target = ratios[key], targets[key]
        if value is None:
            ax_r.text(lo * 1.1, y, "n/a", va="center", color="0.5")
        else:
            color = "tab:green" if value >= target else "tab:red"
            ax_r.barh(y, value - lo, left=lo, height=0.6, color=color, alpha=0.8)
            ax_r.text(value * 1.05, y, f"{value:.2f}", va="center", fontsize=9)
        ax_r.plot([target, target], [y - 0.4, y + 0.4], color="black", linewidth=2)
        ax_r.text(target, y + 0.42, f"target {target:g}", ha="center", fontsize=7)
    ticks = [t for t in (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 50) if lo <= t <= hi]
    ax_r.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax_r.minorticks_off()
    ax_r.set_yticks(ys, keys)
    ax_r.set_title("ratios of median msgs/s (bar) vs target (black line)")

    # -- throughput per case, median with min..max --
    ids = list(cases)
    ys = list(range(len(ids)))[::-1]
    top = max([c["max"] for c in cases.values() if c["max"]] or [1.0])
    for y, case_id in zip(ys, ids, strict=True):
        res = cases[case_id]
        if res["median"] is None:
            ax_t.text(top * 0.01, y, res["status"], va="center", color="0.5")
            continue
        ax_t.barh(y, res["median"], height=0.6, color="tab:blue", alpha=0.8)
        ax_t.errorbar(
            res["median"],
            y,
            xerr=[[res["median"] - res["min"]], [res["max"] - res["median"]]],
            color="black",
            capsize=3,
        )
        cpu = res.get("cpu_us_per_msg")
        label = f"{res['median']:,.0f}" + (f"  ({cpu:.0f} µs CPU/msg)" if cpu else "")
        ax_t.text(res["max"] + top * 0.01, y, label, va="center", fontsize=8)
    ax_t.set_xlim(0, top * 1.35)
    ax_t.set_yticks(ys, ids)
    ax_t.set_xlabel("msgs/s (median, min..max)")
    ax_t.set_title(
        f"{meta['messages']:,} msgs x {meta['rounds']} round(s), RabbitMQ {meta['broker']}, "
        f"{meta['machine']['nproc']} cores, {meta['date']}",
        fontsize=9,
    )

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
