"""Time `tracerl report` on a demo-scale workspace: 200 test tasks per trajectory file, 8 variants,
3 adapters + GRPO-on-target with 40 steps each. Prints the time of each part and the page size.

    python benchmarks/report_build.py
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
import time
from pathlib import Path

from tracerl.core.io import write_json, write_jsonl
from tracerl.evaluation.report import build_report, draw_figures
from tracerl.evaluation.report_data import load_report_data
from tracerl.evaluation.report_html import render_html
from tracerl.evaluation.stats import bootstrap_mean, paired_difference

REPO = Path(__file__).resolve().parents[1]
N_TASKS, N_STEPS = 200, 40


def fixture_module():
    """The test suite's fake-workspace builder (tests/evaluation/test_report.py)."""
    spec = importlib.util.spec_from_file_location("report_fixture", REPO / "tests/evaluation/test_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scaled_workspace(root: Path) -> Path:
    f = fixture_module()
    ws = f.make_workspace(root)
    tasks = [f"test_{i}" for i in range(1, N_TASKS + 1)]
    rates = {"base": 0.33, "prompt_capabilities": 0.36, "grpo_target": 0.38, "trace_router": 0.44, "trace_moe": 0.47}
    base = {t: float(i % 100 < 33) for i, t in enumerate(tasks)}
    for path in sorted((ws / "eval").glob("*.json")):
        e = json.loads(path.read_text())
        rate = rates.get(e["variant"], 0.40)
        per_task = {t: float(i % 100 < rate * 100) for i, t in enumerate(tasks)}
        e.update(per_task=per_task, n_tasks=N_TASKS, pass1=bootstrap_mean(list(per_task.values())).model_dump(),
                 diff_vs_base=None if e["variant"] == "base" else paired_difference(per_task, base).model_dump())
        write_json(path, e)
        if e["variant"] in ("base", "trace_moe"):
            write_jsonl(path.with_suffix(".jsonl"), [f.episode(t, bool(per_task[t])) for t in tasks])
    for path in [*(ws / "adapters").glob("*/metrics.jsonl"), ws / "baselines/grpo_target/metrics.jsonl"]:
        path.write_text("".join(json.dumps(r) + "\n" for r in f.metrics_rows(N_STEPS, 0.3, 0.7)))
    return ws


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = scaled_workspace(Path(tmp))
        t0 = time.perf_counter()
        data = load_report_data(ws)
        t1 = time.perf_counter()
        figures = draw_figures(data)
        t2 = time.perf_counter()
        render_html(data, figures)
        t3 = time.perf_counter()
        report = build_report(ws)
        t4 = time.perf_counter()
        print(f"read workspace   {t1 - t0:6.2f} s")
        print(f"draw {len(figures)} figures  {t2 - t1:6.2f} s")
        print(f"render page      {t3 - t2:6.2f} s")
        print(f"build_report     {t4 - t3:6.2f} s (all of the above, plus writing)")
        print(f"index.html       {report.html_path.stat().st_size / 1024:6.0f} KiB")


if __name__ == "__main__":
    main()
