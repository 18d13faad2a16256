"""The report's figures, drawn with matplotlib's Agg canvas (no display, no global pyplot state).

Each function takes already-validated report data and returns PNG bytes; same data ⇒ same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tracerl.contracts import (
    CalibrationResult,
    CapabilitiesFile,
    EvalResult,
    SampleEfficiency,
)
from tracerl.evaluation.report_data import TrainingCurve

COLORS = {
    "base": "#868e96",
    "prompt_capabilities": "#2f9e44",
    "grpo_target": "#1971c2",
    "swe_rl": "#0c8599",
    "gepa": "#9c36b5",
    "adapter": "#b197fc",
    "trace_router": "#f08c00",
    "trace_moe": "#e8590c",
    "accent": "#e8590c",
    "muted": "#ced4da",
    "ink": "#343a40",
}
STYLE = {
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#adb5bd",
    "axes.labelcolor": COLORS["ink"],
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.grid": True,
    "grid.color": "#e9ecef",
    "grid.linewidth": 0.8,
    "xtick.color": "#495057",
    "ytick.color": "#495057",
    "legend.frameon": False,
    "axes.axisbelow": True,
}
DPI = 110


def variant_color(variant: str) -> str:
    return COLORS["adapter"] if variant.startswith("adapter:") else COLORS.get(variant, COLORS["muted"])


@contextmanager
def _figure(width: float, height: float) -> Iterator[Figure]:
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width, height), dpi=DPI)
        FigureCanvasAgg(fig)
        yield fig


def _png(fig: Figure) -> bytes:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None}, facecolor="white")
    return buf.getvalue()


def capability_plot(caps: CapabilitiesFile) -> bytes:
    """Coverage vs contrastive gap per candidate, with the selection thresholds ρ and δ."""
    with _figure(6.4, 4.2) as fig:
        ax = fig.add_subplot()
        for c in caps.capabilities:
            if c.mean_cov is None or c.mean_delta is None:
                continue
            color = COLORS["accent"] if c.selected else COLORS["base"]
            ax.errorbar(c.mean_cov, c.mean_delta, xerr=c.std_cov or 0.0, yerr=c.std_delta or 0.0, fmt="o", ms=7,
                        color=color, ecolor=color, alpha=0.9, elinewidth=1, capsize=2)
            ax.annotate(c.name, (c.mean_cov, c.mean_delta), textcoords="offset points", xytext=(6, 5),
                        fontsize=8, color=COLORS["ink"])
        ax.axvline(caps.params.rho, color=COLORS["ink"], ls="--", lw=0.9, alpha=0.6)
        ax.axhline(caps.params.delta, color=COLORS["ink"], ls="--", lw=0.9, alpha=0.6)
        ax.plot([], [], "o", color=COLORS["accent"], label="selected")
        ax.plot([], [], "o", color=COLORS["base"], label="not selected")
        ax.plot([], [], "--", color=COLORS["ink"], alpha=0.6, label="thresholds ρ, δ")
        ax.set_xlabel("coverage Cov (share of failures lacking it)")
        ax.set_ylabel("contrastive gap Δ = ER− − ER+")
        ax.set_title("Candidate capabilities (mean ± std over labelling runs)")
        ax.legend(loc="best", fontsize=8)
        return _png(fig)


def calibration_plot(calibration: dict[str, CalibrationResult]) -> bytes | None:
    """Per environment: mean reward and success rate; pass@k against k. None when there is nothing to draw."""
    names = list(calibration)
    has_rates = bool(calibration)
    has_pass_k = any(c.stats.pass_at_k for c in calibration.values())
    if not names or not (has_rates or has_pass_k):
        return None
    panels = int(has_rates) + int(has_pass_k)
    with _figure(5.2 * panels, 3.6) as fig:
        axes = fig.subplots(1, panels, squeeze=False)[0]
        i = 0
        if has_rates:
            ax = axes[i]
            i += 1
            xs = range(len(names))
            width = 0.38
            mean = [c.stats.mean_reward for c in calibration.values()]
            success = [c.stats.success_rate for c in calibration.values()]
            ax.bar([x - width / 2 for x in xs], mean, width, color=COLORS["grpo_target"], label="mean reward")
            ax.bar([x + width / 2 for x in xs], success, width, color=COLORS["accent"], label="success rate")
            first = next(iter(calibration.values())).bands
            bands = (tuple(first.mean_reward), tuple(first.success_rate))
            if bands[0] == bands[1]:
                ax.axhspan(*bands[0], color=COLORS["muted"], alpha=0.35, lw=0, zorder=0, label="acceptance band")
            ax.set_xticks(list(xs), [_short(n) for n in names], rotation=20, ha="right", fontsize=8)
            ax.set_ylim(0, 1)
            ax.set_title("Base agent on each environment")
            ax.legend(fontsize=8)
        if has_pass_k:
            ax = axes[i]
            for name, c in calibration.items():
                if c.stats.pass_at_k:
                    ks = sorted(int(k) for k in c.stats.pass_at_k)
                    ax.plot(ks, [c.stats.pass_at_k[str(k)] for k in ks], "o-", ms=4, label=_short(name))
            ax.set_xscale("log", base=2)
            ax.set_xlabel("k (samples)")
            ax.set_ylabel("pass@k")
            ax.set_ylim(0, 1.02)
            ax.set_title("pass@k at calibration")
            ax.legend(fontsize=8)
        return _png(fig)


def training_plot(curve: TrainingCurve) -> bytes:
    """Group reward and success against rollouts consumed, with held-out success where measured."""
    with _figure(5.2, 3.3) as fig:
        ax = fig.add_subplot()
        x = [r.rollouts_used for r in curve.rows]
        reward = [(r.rollouts_used, r.reward_mean) for r in curve.rows if r.reward_mean is not None]
        success = [(r.rollouts_used, r.success_rate) for r in curve.rows if r.success_rate is not None]
        evals = [(r.rollouts_used, r.eval_success) for r in curve.rows if r.eval_success is not None]
        if reward:
            ax.plot(*zip(*reward), color=COLORS["grpo_target"], lw=1.6, label="train reward (mean)")
        if success:
            ax.plot(*zip(*success), color=COLORS["muted"], lw=1.4, label="train success")
        if evals:
            ax.plot(*zip(*evals), "o-", color=COLORS["accent"], ms=5, lw=1.6, label="held-out success")
        ax.set_xlim(min(x), max(max(x), min(x) + 1))
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("rollouts consumed")
        ax.set_title({"grpo_target": "GRPO on the target (baseline)", "swe_rl": "SWE-RL (baseline)"}.get(curve.name, curve.name))
        ax.legend(fontsize=8, loc="lower right")
        return _png(fig)


def evaluation_plot(evaluation: dict[str, EvalResult]) -> bytes:
    """pass^1 per variant with its 95% interval; paired difference against base with its interval."""
    names = list(evaluation)
    diffs = [(n, e.diff_vs_base) for n, e in evaluation.items() if e.diff_vs_base is not None and n != "base"]
    panels = 2 if diffs else 1
    height = max(2.6, 0.42 * len(names) + 1.2)
    with _figure(5.6 * panels, height) as fig:
        axes = fig.subplots(1, panels, squeeze=False)[0]
        ax = axes[0]
        ys = list(range(len(names)))[::-1]
        for y, name in zip(ys, names, strict=True):
            p = evaluation[name].pass1
            ax.barh(y, p.mean * 100, color=variant_color(name), height=0.64)
            ax.errorbar(p.mean * 100, y, xerr=[[(p.mean - p.low) * 100], [(p.high - p.mean) * 100]],
                        fmt="none", ecolor=COLORS["ink"], capsize=3, lw=1)
            ax.text(p.high * 100 + 1, y, f"{p.mean * 100:.1f}", va="center", fontsize=8, color=COLORS["ink"])
        ax.set_yticks(ys, names, fontsize=9)
        ax.set_xlim(0, 105)
        ax.set_xlabel("pass^1 on held-out test tasks, % (95% bootstrap interval)")
        ax.set_title("Evaluation")
        ax.grid(axis="y", visible=False)
        if diffs:
            ax = axes[1]
            ys = list(range(len(diffs)))[::-1]
            for y, (name, d) in zip(ys, diffs, strict=True):
                ax.errorbar(d.mean * 100, y, xerr=[[(d.mean - d.low) * 100], [(d.high - d.mean) * 100]],
                            fmt="o", ms=7, color=variant_color(name), ecolor=COLORS["ink"], capsize=3, lw=1)
            ax.axvline(0, color=COLORS["ink"], lw=1)
            ax.set_yticks(ys, [n for n, _ in diffs], fontsize=9)
            ax.set_xlabel("paired difference vs base, points (95% interval)")
            ax.set_title("Gain over base")
            ax.grid(axis="y", visible=False)
        return _png(fig)


def sample_efficiency_plot(se: SampleEfficiency, trace_variant: str | None) -> bytes:
    """Left: validation pass rate against rollouts consumed, TRACE and GRPO on the target (and SWE-RL) on the same
    episodes, each point with its 95% interval, the base's band across. Right: pass^1 on the test tasks
    at each one's final budget, with its 95% interval."""
    panels = 2 if se.test else 1
    with _figure(5.6 + 3.4 * (panels - 1), 4.0) as fig:
        axes = fig.subplots(1, panels, squeeze=False, width_ratios=[5.6, 3.4][:panels])[0]
        ax = axes[0]
        if se.base is not None:
            ax.axhspan(se.base.interval.low * 100, se.base.interval.high * 100, color=COLORS["base"], alpha=0.15, lw=0)
            ax.axhline(se.base.interval.mean * 100, color=COLORS["base"], ls=":", lw=1.2, label="base (step 0)")
        for points, label, color, marker in ((se.grpo_target, "GRPO on target", COLORS["grpo_target"], "s"),
                                             (se.swe_rl, "SWE-RL", COLORS["swe_rl"], "D"),
                                             (se.trace, "TRACE", COLORS["accent"], "o")):
            if not points:
                continue
            xs = [p.rollouts for p in points]
            ys = [p.interval.mean * 100 for p in points]
            errors = [[(p.interval.mean - p.interval.low) * 100 for p in points],
                      [(p.interval.high - p.interval.mean) * 100 for p in points]]
            ax.errorbar(xs, ys, yerr=errors, fmt=f"{marker}-", color=color, ecolor=color, elinewidth=1, capsize=3,
                        ms=6, lw=1.8, label=label)
        ax.set_xlabel("training rollouts consumed (TRACE: every adapter + gate data)")
        ax.set_ylabel("validation pass rate, % (95% interval)")
        ax.set_ylim(0, 100)
        ax.set_title(f"Validation: {(se.grpo_target or se.trace)[0].episodes} train-split tasks", fontsize=10)
        ax.legend(fontsize=8, loc="best")
        if se.test:
            ax = axes[1]
            names = list(se.test)
            xs = range(len(names))
            for x, name in zip(xs, names, strict=True):
                i = se.test[name]
                color = COLORS["accent"] if name == trace_variant else variant_color(name)
                ax.bar(x, i.mean * 100, color=color, width=0.6)
                ax.errorbar(x, i.mean * 100, yerr=[[(i.mean - i.low) * 100], [(i.high - i.mean) * 100]], fmt="none",
                            ecolor=COLORS["ink"], capsize=3, lw=1)
                ax.text(x, i.high * 100 + 2, f"{i.mean * 100:.1f}", ha="center", fontsize=8, color=COLORS["ink"])
            ax.set_xticks(list(xs), names, fontsize=8, rotation=15)
            ax.set_ylim(0, 100)
            ax.set_ylabel("test pass^1, % (95% interval)")
            ax.set_title(f"Test: {se.test_tasks} tasks, final budget", fontsize=10)
            ax.grid(axis="x", visible=False)
        return _png(fig)


def _short(name: str, limit: int = 22) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"
