"""`tracerl report`: read a workspace, draw the figures, write report/index.html, report/*.png, report/report.json.

Everything is read and drawn in memory first; files are written (atomically) only when all of it
succeeded, so a malformed input leaves the previous report untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tracerl.contracts import ReportSummary
from tracerl.core.io import atomic_write_bytes, atomic_write_text
from tracerl.evaluation import plots
from tracerl.evaluation.report_data import ReportData, load_report_data
from tracerl.evaluation.report_html import render_html

REPORT_DIR = "report"
# For the stage cache: what the report reads (files or folders, workspace-relative) and what it writes.
REPORT_INPUTS = ("config.yaml", "rollouts/base.jsonl", "capabilities.json", "envs", "adapters",
                 "baselines/grpo_target/metrics.jsonl", "baselines/swe_rl/metrics.jsonl", "eval",
                 "composed/composition.json")
REPORT_OUTPUTS = ("report/index.html", "report/report.json")


@dataclass
class Report:
    """What `build_report` wrote."""

    data: ReportData
    html_path: Path
    json_path: Path
    figure_paths: dict[str, Path]  # figure name → PNG path
    summary: ReportSummary  # the content of report.json


def draw_figures(data: ReportData) -> dict[str, bytes]:
    """Every figure the data allows, by name: capabilities, calibration, train:<name>, evaluation, sample_efficiency."""
    figures: dict[str, bytes] = {}
    if data.capabilities is not None and data.capabilities.capabilities:
        figures["capabilities"] = plots.capability_plot(data.capabilities)
    if data.calibration:
        png = plots.calibration_plot(data.calibration)
        if png is not None:
            figures["calibration"] = png
    for name, curve in data.training.items():
        figures[f"train:{name}"] = plots.training_plot(curve)
    for curve in (data.grpo_training, data.swe_rl_training):
        if curve is not None:
            figures[f"train:{curve.name}"] = plots.training_plot(curve)
    if data.evaluation:
        figures["evaluation"] = plots.evaluation_plot(data.evaluation)
    if data.sample_efficiency is not None:
        figures["sample_efficiency"] = plots.sample_efficiency_plot(data.sample_efficiency, data.trace_variant)
    return figures


def figure_file_names(names: list[str]) -> dict[str, str]:
    """A distinct, file-system-safe PNG name per figure (`train:tool_precision` → `train-tool_precision.png`)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for name in names:
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", name.replace(":", "-")).strip(".-") or "figure"
        candidate, i = stem, 2
        while candidate in used:
            candidate, i = f"{stem}-{i}", i + 1
        used.add(candidate)
        out[name] = f"{candidate}.png"
    return out


def build_report(workspace: str | Path) -> Report:
    """Write `<workspace>/report/` from the workspace's stage outputs; raises `InputError` on a malformed file."""
    ws = Path(workspace)
    data = load_report_data(ws)
    figures = draw_figures(data)
    files = figure_file_names(list(figures))
    summary = data.summary()
    summary.figures = {name: files[name] for name in figures}
    page = render_html(data, figures)

    out = ws / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / files[name] for name in figures}
    for name, png in figures.items():
        atomic_write_bytes(paths[name], png)
    for stale in out.glob("*.png"):  # figures of an earlier report that this one no longer has
        if stale not in paths.values():
            stale.unlink()
    json_path, html_path = out / "report.json", out / "index.html"
    summary.write(json_path)
    atomic_write_text(html_path, page)
    return Report(data=data, html_path=html_path, json_path=json_path, figure_paths=paths, summary=summary)
