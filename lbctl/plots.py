"""Broker usage over time as a PNG: what ``lbctl run`` and ``lbctl monitor --record`` leave behind.

One line per broker (its largest resource usage, Pulsar's ``getMaxResourceUsage``, in percent),
the mean as a dashed line, the overload threshold
(``loadBalancerBrokerOverloadedThresholdPercentage``) as a red line, and a strip under the plot
with one marker per applied decision (split, unload, transfer, merge) at the time it was applied,
so a drop in a broker's line can be matched with the move that caused it. A grey band, named
at its top, covers each period a service (Kafka, Redis, the streaming job, a controller) was
down or stale; the usage lines have a gap there rather than the last values drawn flat.

matplotlib is imported inside ``write_usage_png`` only: the table works without it, and without
it the PNG is skipped with one line saying how to install it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_MARKERS = {"split": "^", "unload": "v", "transfer": "D", "merge": "s"}
_KIND_COLOURS = {"split": "tab:purple", "unload": "tab:orange", "transfer": "tab:blue",
                 "merge": "tab:green"}  # fmt: skip
INSTALL_HINT = "pip install 'pulsar-lb-stream[plots]' (scripts/bootstrap.sh installs it)"


@dataclass
class UsageHistory:
    """Samples of broker usage and applied decisions, on one time axis (``x_label``).

    ``lbctl run`` and ``lbctl monitor`` sample seconds since their start; ``lbctl run --fast``
    samples virtual minutes. A broker missing from a sample (not reporting yet, or gone) leaves
    a gap in its line rather than a fake zero.
    """

    x_label: str = "seconds since start"
    times: list[float] = field(default_factory=list)
    usage_pct: dict[str, list[float | None]] = field(default_factory=dict)
    decisions: list[tuple[float, str]] = field(default_factory=list)
    # (time, services in trouble at that refresh), one per refresh: outages over time
    troubles: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)

    def trouble(self, t: float, services: list[str]) -> None:
        """Note which services were down or stale at ``t`` (an empty list: none)."""
        self.troubles.append((t, tuple(services)))

    def outages(self) -> list[tuple[str, float, float]]:
        """(service and state, start, end) of each period a service was in trouble: from
        the first refresh that saw it to the first that did not (or the last refresh)."""
        out: list[tuple[str, float, float]] = []
        open_at: dict[str, float] = {}
        for t, names in self.troubles:
            for name in names:
                open_at.setdefault(name, t)
            for name in [n for n in open_at if n not in names]:
                out.append((name, open_at.pop(name), t))
        end = self.troubles[-1][0] if self.troubles else 0.0
        out += [(name, start, end) for name, start in open_at.items()]
        return sorted(out, key=lambda o: (o[1], o[0]))

    def sample(self, t: float, usage_pct: dict[str, float]) -> None:
        n = len(self.times)
        self.times.append(t)
        for broker, value in usage_pct.items():
            self.usage_pct.setdefault(broker, [None] * n).append(value)
        for series in self.usage_pct.values():
            if len(series) < n + 1:
                series.append(None)

    def mark(self, t: float, kind: str) -> None:
        self.decisions.append((t, kind))

    def __len__(self) -> int:
        return len(self.times)


def write_usage_png(
    history: UsageHistory,
    path: Path,
    *,
    title: str,
    overloaded_pct: float,
    out: Any = None,
) -> Path | None:
    """Write the picture; None (and one line on ``out``) without matplotlib or samples."""
    out = out or sys.stderr
    if len(history) < 2:
        print(f"usage plot: fewer than 2 samples, no picture written to {path}", file=out)
        return None
    try:  # matplotlib: the optional 'plots' extra; without it a run ends without a picture
        import matplotlib

        matplotlib.use("Agg")  # before pyplot loads: no display here
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"usage plot skipped: matplotlib is not installed ({INSTALL_HINT})", file=out)
        return None

    fig, (ax, strip) = plt.subplots(
        2, 1, figsize=(10, 5.6), sharex=True, gridspec_kw={"height_ratios": [5, 1]}
    )
    _draw_usage(ax, history, title, overloaded_pct)
    _draw_outages(ax, history)
    _draw_decisions(ax, strip, history)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _draw_usage(ax: Any, history: UsageHistory, title: str, overloaded_pct: float) -> None:
    """Each broker's usage over time, their mean, and the overloaded threshold."""
    t = history.times
    for broker in sorted(history.usage_pct):
        values = [float("nan") if v is None else v for v in history.usage_pct[broker]]
        ax.plot(t, values, linewidth=1.6, label=broker)
    means = []
    for i in range(len(t)):
        have = [s[i] for s in history.usage_pct.values() if s[i] is not None]
        means.append(sum(have) / len(have) if have else float("nan"))
    ax.plot(t, means, color="black", linestyle="--", linewidth=1.2, label="mean")
    ax.axhline(overloaded_pct, color="red", linestyle="-", linewidth=1.2, alpha=0.8)
    ax.text(
        0.005, overloaded_pct + 1, f"overloaded ({overloaded_pct:g}%)", color="red", fontsize=9,
        transform=ax.get_yaxis_transform(), va="bottom",
    )  # fmt: skip
    top = max([0.0, *(v for s in history.usage_pct.values() for v in s if v is not None)])
    ax.set_ylim(0, max(overloaded_pct + 8, top * 1.05))
    ax.set_ylabel("max resource usage, %")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _draw_outages(ax: Any, history: UsageHistory) -> None:
    """A grey band over each period a service was down or stale, named at its top: the
    usage lines have a gap there, since nothing current was read."""
    for row, (name, start, end) in enumerate(history.outages()):
        ax.axvspan(start, max(end, start + 0.5), color="grey", alpha=0.25, linewidth=0)
        ax.text(
            start, 0.98 - 0.06 * (row % 5), f" {name}", transform=ax.get_xaxis_transform(),
            color="dimgrey", fontsize=8, va="top",
        )  # fmt: skip


def _draw_decisions(ax: Any, strip: Any, history: UsageHistory) -> None:
    """One strip row per decision kind applied, a faint line on the usage axes at each."""
    kinds = [k for k in _MARKERS if any(kind == k for _, kind in history.decisions)]
    for row, kind in enumerate(kinds):
        xs = [round(x, 0) for x, k in history.decisions if k == kind]  # one second per slot
        strip.scatter(
            xs, [row] * len(xs), marker=_MARKERS[kind], color=_KIND_COLOURS[kind], s=36,
            label=f"{kind} ({len(xs)})",
        )  # fmt: skip
        for x in sorted(set(xs)):
            ax.axvline(x, color=_KIND_COLOURS[kind], alpha=0.12, linewidth=1)
            if (n := xs.count(x)) > 1:  # several at one sample: say how many
                strip.annotate(f"{n}", (x, row), xytext=(4, 2), textcoords="offset points",
                               fontsize=7, color=_KIND_COLOURS[kind])  # fmt: skip
    strip.set_yticks(range(len(kinds)), kinds, fontsize=8)
    strip.set_ylim(-0.7, max(len(kinds), 1) - 0.3)
    if not kinds:
        strip.text(0.5, 0.5, "no decision applied", transform=strip.transAxes, ha="center")
    strip.set_xlabel(history.x_label)
    strip.grid(axis="x", alpha=0.3)
    if kinds:
        strip.legend(loc="upper left", bbox_to_anchor=(1.01, 1.2), fontsize=8, frameon=False)
