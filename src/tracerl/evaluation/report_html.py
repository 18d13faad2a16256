"""The report page: one self-contained HTML file (inline CSS, PNGs as data URIs, no script, no fetches).

Every string that comes from the workspace goes through `esc` before it reaches the page.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable

from tracerl.contracts import COMPOSITION_MODES, CalibrationResult, CapabilityResult, EvalResult, Interval
from tracerl.core.messages import Message
from tracerl.core.trajectory import Trajectory
from tracerl.evaluation.report_data import ReportData, TrainingCurve, interval_text, pct

TEXT_LIMIT = 600  # characters of a message shown before "… (+N characters)"
ARGS_LIMIT = 300

CSS = """
:root { --ink:#212529; --soft:#495057; --faint:#868e96; --line:#e9ecef; --bg:#f8f9fa; --accent:#e8590c;
        --good:#2b8a3e; --bad:#c92a2a; --blue:#1971c2; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color:var(--ink); background:var(--bg); }
main { max-width:1180px; margin:0 auto; padding:28px 28px 60px; }
header h1 { margin:0; font-size:28px; letter-spacing:-.5px; }
header h1 span { color:var(--accent); }
header p { margin:4px 0 0; color:var(--soft); }
header p.answer { color:inherit; font-size:17px; margin:8px 0; }
nav { margin:16px 0 8px; display:flex; flex-wrap:wrap; gap:6px; }
nav a { color:var(--soft); text-decoration:none; font-size:13px; padding:3px 10px; border:1px solid var(--line);
        border-radius:14px; background:#fff; }
section { background:#fff; border:1px solid var(--line); border-radius:10px; padding:18px 22px; margin:18px 0; }
h2 { margin:0 0 10px; font-size:19px; }
h3 { margin:18px 0 8px; font-size:15px; }
.note { color:var(--faint); font-size:13px; margin:4px 0 10px; }
.missing { color:var(--soft); background:#fff4e6; border-left:3px solid #ffa94d; padding:8px 12px; margin:6px 0;
           border-radius:4px; font-size:14px; }
.cards { display:grid; grid-template-columns:repeat(auto-fit, minmax(200px, 1fr)); gap:14px; background:none;
         border:none; padding:0; }
.card { background:#fff; border:1px solid var(--line); border-radius:10px; padding:14px 16px; }
.card.trace { border:2px solid var(--accent); }
.card .label { font-size:12px; text-transform:uppercase; letter-spacing:.6px; color:var(--faint); }
.card .big { font-size:34px; font-weight:700; line-height:1.15; margin:4px 0 2px; }
.card.trace .big { color:var(--accent); }
.card .ci, .card .sub { font-size:13px; color:var(--soft); }
.up { color:var(--good); font-weight:600; } .down { color:var(--bad); font-weight:600; }
.scroll { overflow-x:auto; }
table { border-collapse:collapse; width:100%; font-size:13.5px; }
th { text-align:left; font-weight:600; color:var(--soft); border-bottom:2px solid var(--line); padding:6px 7px;
     vertical-align:bottom; }
td { border-bottom:1px solid var(--line); padding:6px 7px; vertical-align:top; }
.nowrap { white-space:nowrap; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
td.num { white-space:nowrap; }
tr.selected td:first-child { border-left:3px solid var(--accent); }
.desc { color:var(--faint); font-size:12.5px; }
.badge { display:inline-block; font-size:11.5px; font-weight:600; padding:1px 8px; border-radius:10px; }
.badge.yes { background:#fff0e6; color:var(--accent); } .badge.no { background:#f1f3f5; color:var(--faint); }
.badge.pass { background:#ebfbee; color:var(--good); } .badge.fail { background:#fff5f5; color:var(--bad); }
.badge.warn { background:#fff9db; color:#e67700; }
img.fig { max-width:100%; height:auto; display:block; margin:10px auto; }
.grid { display:grid; grid-template-columns:repeat(auto-fit, minmax(420px, 1fr)); gap:14px; }
.grid figure { margin:0; border:1px solid var(--line); border-radius:8px; padding:6px 10px; }
figcaption { font-size:12.5px; color:var(--soft); padding:0 4px 6px; }
.pair { display:grid; grid-template-columns:1fr 1fr; gap:14px; }
.episode { border:1px solid var(--line); border-radius:8px; padding:10px; background:#fcfcfd; min-width:0; }
.episode h4 { margin:0 0 8px; font-size:14px; display:flex; justify-content:space-between; gap:8px; }
.msg { border-radius:8px; padding:6px 10px; margin:6px 0; font-size:13px; }
.msg .role { font-size:11px; font-weight:700; text-transform:uppercase; letter-spacing:.5px; color:var(--faint); }
.msg.user { background:#e7f5ff; margin-right:18%; }
.msg.assistant { background:#fff4e6; margin-left:18%; }
.msg.tool { background:#f1f3f5; font-family:ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
            font-size:12px; }
.msg.tool.error { background:#fff5f5; border-left:3px solid var(--bad); }
.msg.system { background:#f8f9fa; border:1px dashed var(--line); }
.msg.system summary { cursor:pointer; color:var(--faint); font-size:12px; }
.text { white-space:pre-wrap; overflow-wrap:anywhere; }
.call { font-family:ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size:12px; margin-top:3px;
        overflow-wrap:anywhere; }
.call b { color:var(--blue); }
.cut { color:var(--faint); font-style:italic; }
pre { background:#f8f9fa; border:1px solid var(--line); border-radius:6px; padding:10px; overflow:auto;
      font-size:12px; }
footer { color:var(--faint); font-size:12px; text-align:center; margin-top:26px; }
"""

SECTIONS = (
    ("headline", "Headline"), ("capabilities", "Capabilities"), ("calibration", "Environments"),
    ("training", "Training"), ("evaluation", "Evaluation"), ("sample-efficiency", "Sample efficiency"),
    ("examples", "Examples"), ("config", "Config"),
)


def esc(value: object) -> str:
    """HTML-escape anything (quotes included) for text and attribute values."""
    return html.escape(str(value), quote=True)


def render_html(data: ReportData, figures: dict[str, bytes]) -> str:
    """The whole page. `figures` maps a figure name (see `report.py`) to its PNG bytes."""
    nav = "".join(f'<a href="#{key}">{esc(title)}</a>' for key, title in SECTIONS)
    body = "\n".join([
        _header(data),
        f"<nav>{nav}</nav>",
        _headline(data),
        _capabilities(data, figures),
        _calibration(data, figures),
        _training(data, figures),
        _evaluation(data, figures),
        _sample_efficiency(data, figures),
        _examples(data),
        _config(data),
        '<footer>Generated by <code>tracerl report</code> from the files of the workspace. '
        "Test-task intervals are 95% bootstrap intervals over tasks; validation intervals are 95% Wilson intervals.</footer>",
    ])
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>TRACE report · {esc(_workspace_name(data))}</title>\n<style>{CSS}</style>\n</head>\n"
        f"<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )


# ----------------------------------------------------------------------------- formatting


def pts(x: float) -> str:
    return f"{x * 100:+.1f} pts"


def _signed(i: Interval) -> str:
    """A paired difference, coloured by whether its interval excludes 0."""
    cls = "up" if i.low > 0 else "down" if i.high < 0 else ""
    return f'<span class="{cls}">{esc(pts(i.mean))}</span> <span class="ci">{esc(interval_text(i, points=True))}</span>'


def _img(figures: dict[str, bytes], name: str, alt: str) -> str:
    png = figures.get(name)
    if png is None:
        return ""
    return f'<img class="fig" alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _missing(data: ReportData, key: str, default: str) -> str:
    return f'<p class="missing">Not available yet — {esc(data.missing.get(key, default))}</p>'


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return esc(text)
    return f'{esc(text[:limit])}<span class="cut">… (+{len(text) - limit:,} characters)</span>'


def _workspace_name(data: ReportData) -> str:
    return data.workspace.rstrip("/").rsplit("/", 1)[-1] or data.workspace


def _table(headers: Iterable[tuple[str, bool]], rows: Iterable[str]) -> str:
    head = "".join(f'<th class="num">{esc(h)}</th>' if num else f"<th>{esc(h)}</th>" for h, num in headers)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def _num(value: object) -> str:
    if value is None:
        return '<td class="num">—</td>'
    if isinstance(value, float):
        return f'<td class="num">{value:.2f}</td>'
    return f'<td class="num">{esc(value)}</td>'


# ----------------------------------------------------------------------------- sections


def _header(data: ReportData) -> str:
    parts = [f"workspace <code>{esc(data.workspace)}</code>"]
    if data.base_rollouts:
        n, p = data.base_rollouts["trajectories"], data.base_rollouts["passed"]
        parts.append(f"base agent on the target's train split: {p} of {n} tasks passed ({pct(p / n if n else None)})")
    if data.capabilities:
        sel = [c.name for c in data.capabilities.capabilities if c.selected]
        parts.append(f"{len(sel)} of {len(data.capabilities.capabilities)} candidate capabilities selected")
    headline = data.headline()
    lead = f'<p class="answer">{esc(headline.answer)}</p>' if headline.answer else ""
    lead += "".join(f'<p class="note">{esc(note)}</p>' for note in headline.notes)
    return f'<header id="top"><h1>TRACE <span>report</span></h1>{lead}<p>{" · ".join(parts)}</p></header>'


def _card(label: str, big: str, lines: list[str], *, trace: bool = False) -> str:
    sub = "".join(f'<div class="sub">{line}</div>' for line in lines)
    return f'<div class="card{" trace" if trace else ""}"><div class="label">{esc(label)}</div>' \
           f'<div class="big">{esc(big)}</div>{sub}</div>'


def _variant_card(label: str, e: EvalResult | None, *, trace: bool = False, extra: list[str] | None = None) -> str:
    if e is None:
        return _card(label, "—", ['<span class="ci">not evaluated yet</span>'], trace=trace)
    lines = [f'<span class="ci">{esc(interval_text(e.pass1))}</span>']
    if e.diff_vs_base is not None and e.variant != "base":
        lines.append(f"vs base: {_signed(e.diff_vs_base)}")
    lines.append(f"{e.rollouts_used:,} training rollouts · {e.n_tasks} tasks")
    return _card(label, pct(e.pass1.mean), lines + (extra or []), trace=trace)


def _headline(data: ReportData) -> str:
    ev = data.evaluation
    trace = ev.get(data.trace_variant) if data.trace_variant else None
    trace_label = f"TRACE ({data.trace_variant.replace('trace_', '')})" if data.trace_variant else "TRACE"
    grpo_extra = [f"TRACE − GRPO: {_signed(data.trace_vs_grpo)}"] if data.trace_vs_grpo else []
    grpo = ev.get("grpo_target")
    if trace is not None and grpo is not None and grpo.rollouts_used != trace.rollouts_used:
        grpo_extra.append(f'<span class="down">budget differs from TRACE\'s ({trace.rollouts_used:,})</span>')
    swe_rl_extra = [f"TRACE − SWE-RL: {_signed(data.trace_vs_swe_rl)}"] if data.trace_vs_swe_rl else []
    swe_rl = ev.get("swe_rl")
    if trace is not None and swe_rl is not None and swe_rl.rollouts_used != trace.rollouts_used:
        swe_rl_extra.append(f'<span class="down">budget differs from TRACE\'s ({trace.rollouts_used:,})</span>')
    cards = [
        _variant_card(trace_label, trace, trace=True),
        _variant_card("Base model", ev.get("base")),
        _variant_card("GRPO on target (same budget)", ev.get("grpo_target"), extra=grpo_extra),
        _variant_card("Prompt with capabilities", ev.get("prompt_capabilities")),
    ]
    if "swe_rl" in ev:  # a code target's SWE-RL baseline (GRPO with the patch-similarity reward, same budget)
        cards.insert(3, _variant_card("SWE-RL (same budget)", ev["swe_rl"], extra=swe_rl_extra))
    if "gepa" in ev:
        cards.append(_variant_card("GEPA prompt (same budget)", ev["gepa"]))
    if data.composition is not None:
        cards.append(_routing_card(data))
    note = "" if ev else _missing(data, "evaluation", "the eval stage has not run yet.")
    if "gepa" in data.missing:
        note += f'<p class="note">{esc(data.missing["gepa"])}</p>'
    return f'<section id="headline" class="cards">{"".join(cards)}</section>{note}'


def _routing_card(data: ReportData) -> str:
    """How the report's TRACE composition routes, and how well, on what it was measured."""
    spec = data.composition
    how = COMPOSITION_MODES[spec.mode].summary
    if spec.mode == "moe":
        how = ("the gates' per-token majority over each episode's opening picks one adapter for the whole episode"
               if spec.moe_routing == "opening" else "a gate per decoder layer sends each token to one adapter")
    lines = [f'<span class="ci">{esc(how)}</span>']
    accuracy = spec.routing_accuracy
    if accuracy is not None:
        by_cap = " · ".join(f"{esc(k)} {pct(v)}" for k, v in accuracy.per_capability.items())
        lines.append(f'<span class="ci">{by_cap}</span>')
        lines.append(f'<span class="ci">measured on {accuracy.num_prompts} held-out openings of the capability '
                     f'environments ({esc(accuracy.method)}), not on the target</span>')
        return _card(f"Routing ({spec.mode})", pct(accuracy.overall), lines)
    return _card(f"Routing ({spec.mode})", "—", lines + ['<span class="ci">routing accuracy not measured</span>'])


def _capabilities(data: ReportData, figures: dict[str, bytes]) -> str:
    caps = data.capabilities
    head = '<section id="capabilities"><h2>Capabilities the agent lacks</h2>'
    if caps is None:
        return head + _missing(data, "capabilities", "the select stage has not run yet.") + "</section>"
    p, t = caps.params, caps.totals
    params = [f"selected iff Cov ≥ ρ = {p.rho:g} and Δ ≥ δ = {p.delta:g}",
              f"in at least K = {p.k:g} of N = {p.n:g} labelling runs",
              f"{t.failed} failed / {t.passed} passed trajectories"]
    ordered = sorted(caps.capabilities, key=lambda c: (not c.selected, -(c.mean_delta if c.mean_delta is not None
                                                                         else float("-inf"))))
    rows = [_capability_row(c) for c in ordered]
    headers = [("capability", False), ("selected", False), ("Cov", True), ("Δ", True), ("runs passed", True),
               ("ER+ = 0", False), ("example failed tasks", False)]
    return (head + f'<p class="note">{esc("; ".join(params))}. Ranked by mean Δ. '
            "ER+ = 0 marks a capability never judged on passed trajectories: its Δ is inflated.</p>"
            + _table(headers, rows) + _img(figures, "capabilities", "coverage vs contrastive gap") + "</section>")


def _capability_row(c: CapabilityResult) -> str:
    def stat(mean: float | None, std: float | None, ci: tuple[float | None, float | None] | None) -> str:
        if mean is None:
            return '<td class="num">—</td>'
        ci_text = (f'<div class="desc">[{ci[0]:.2f}, {ci[1]:.2f}]</div>'
                   if ci and ci[0] is not None and ci[1] is not None else "")
        return f'<td class="num">{mean:.2f}{f" ± {std:.2f}" if std is not None else ""}{ci_text}</td>'

    selected = '<span class="badge yes">selected</span>' if c.selected else '<span class="badge no">no</span>'
    if c.decoy:
        selected += ' <span class="badge no">decoy</span>'
    flag = '<span class="badge warn">ER+ = 0</span>' if c.er_plus_flag else "no"
    examples = ", ".join(f'<span title="{esc(x.evidence)}">{esc(x.task_id)}</span>' if x.evidence else esc(x.task_id)
                         for x in c.example_failed[:4]) + (" …" if len(c.example_failed) > 4 else "")
    return (f'<tr class="{"selected" if c.selected else ""}"><td><b>{esc(c.name)}</b>'
            f'<div class="desc">{esc(c.description)}</div></td><td>{selected}</td>'
            f"{stat(c.mean_cov, c.std_cov, c.cov_ci95)}{stat(c.mean_delta, c.std_delta, c.delta_ci95)}"
            f'<td class="num">{c.runs_passed} / {c.runs_total}</td><td>{flag}</td><td class="desc">{examples}</td></tr>')


TRAINED_REJECTED = '<span class="badge warn">rejected by calibration, trained anyway</span>'
NOT_TRAINED = '<span class="badge warn">not trained: no group with mixed rewards</span>'


def _calibration(data: ReportData, figures: dict[str, bytes]) -> str:
    head = ('<section id="calibration"><h2>Training environments</h2><p class="note">The base agent sampled on '
            "each synthesized environment at its calibrated difficulty. Groups: share of seeds where every sample "
            "succeeded / every reward was 0 / outcomes were mixed (only mixed groups carry a GRPO signal).</p>")
    if not data.calibration:
        return head + _missing(data, "calibration", "the synthesize stage has not run yet.") + "</section>"
    ks = sorted({int(k) for c in data.calibration.values() for k in c.stats.pass_at_k})
    headers = [("environment", False), ("accepted", False), ("difficulty", False), ("mean reward", True),
               ("success", True), ("reward std", True), ("groups ✓ / 0 / mixed", True)] + [
               (f"pass@{k}", True) for k in ks]
    rows = []
    for name, c in data.calibration.items():
        accepted = '<span class="badge pass">accepted</span>' if c.accepted else '<span class="badge fail">rejected</span>'
        if name in data.trained_rejected:
            accepted += f" {TRAINED_REJECTED}"
        elif c.stats.without_signal and name not in data.training:
            accepted += f" {NOT_TRAINED}"
        st = c.stats
        groups = " / ".join(f"{x * 100:.0f}%" for x in (st.all_success, st.all_zero, st.informative))
        cells = [f'<td class="nowrap">{_round_path(c)}</td>', _num(st.mean_reward), _num(st.success_rate),
                 _num(st.reward_std), f'<td class="num">{groups}</td>'] + [_num(st.pass_at_k.get(str(k))) for k in ks]
        rows.append(f"<tr><td><b>{esc(name)}</b></td><td>{accepted}</td>{''.join(cells)}</tr>")
    return head + _table(headers, rows) + _img(figures, "calibration", "calibration of each environment") + "</section>"


def _round_path(c: CalibrationResult) -> str:
    """`2 ✗ → 3 ✓`: the difficulty of each round and whether it was accepted; the stop reason on hover."""
    if not c.rounds:
        return esc(c.difficulty)
    marks = " → ".join(f"{r.difficulty}{' ✓' if r.accepted else ' ✗'}" for r in c.rounds)
    title = f' title="{esc(c.stop_reason)}"' if c.stop_reason else ""
    return f'<span class="desc"{title}>{esc(marks)}</span>'


def _training(data: ReportData, figures: dict[str, bytes]) -> str:
    head = ('<section id="training"><h2>Adapter training</h2><p class="note">GRPO on each capability\'s '
            "environment (one LoRA adapter each): group reward and held-out success against rollouts consumed. An "
            "adapter's held-out success is on its own environment's held-out seeds; GRPO on the target's, on the "
            "validation tasks of the target's train split.</p>")
    curves = list(data.training.values()) + [c for c in (data.grpo_training, data.swe_rl_training) if c]
    if not data.training:
        head += _missing(data, "training", "the train stage has not run yet.")
    if not curves:
        return head + "</section>"
    items = [f'<figure>{_img(figures, f"train:{c.name}", f"training curve of {c.name}")}'
             f"<figcaption>{_curve_caption(c)}{' ' + TRAINED_REJECTED if c.name in data.trained_rejected else ''}"
             "</figcaption></figure>" for c in curves]
    return head + f'<div class="grid">{"".join(items)}</div></section>'


BASELINE_LABELS = {"grpo_target": "GRPO on the target environment (baseline)",
                   "swe_rl": "SWE-RL: GRPO on the target with the patch-similarity reward (baseline)"}


def _curve_caption(c: TrainingCurve) -> str:
    f = c.final()
    label = BASELINE_LABELS.get(c.name, esc(c.name))
    parts = [f"<b>{label}</b>", f"{f.rollouts_used:,} rollouts in {f.steps} steps"]
    if f.reward_mean is not None:
        parts.append(f"final train reward {f.reward_mean:.2f}")
    if f.eval_success is not None:
        where = "validation" if c.name in BASELINE_LABELS else "held-out"
        parts.append(f"{where} success {pct(f.eval_success_start)} → {pct(f.eval_success)}")
    return " · ".join(parts)


def _evaluation(data: ReportData, figures: dict[str, bytes]) -> str:
    head = ('<section id="evaluation"><h2>Evaluation on the test tasks</h2><p class="note">The target\'s test split, '
            "never trained or validated on; greedy, τ²-style pass^k; paired differences against the base model over "
            "the same tasks.</p>")
    if not data.evaluation:
        return head + _missing(data, "evaluation", "the eval stage has not run yet.") + "</section>"
    ks = sorted({int(k) for e in data.evaluation.values() for k in e.pass_k if k != "1"})
    headers = [("variant", False), ("pass^1", True), ("95% CI", True)] + [(f"pass^{k}", True) for k in ks] + [
        ("vs base (paired)", True), ("training rollouts", True), ("tasks", True), ("remaining failures", False)]
    rows = []
    for name, e in data.evaluation.items():
        diff = _signed(e.diff_vs_base) if e.diff_vs_base is not None and name != "base" else "—"
        failures = " · ".join(f"{esc(cap)} {n}" for cap, n in sorted(e.failures_by_capability.items(),
                                                                      key=lambda kv: -kv[1]))
        n_tasks = e.n_tasks
        rows.append(
            f'<tr class="{"selected" if name == data.trace_variant else ""}"><td><b>{esc(name)}</b></td>'
            f'<td class="num">{pct(e.pass1.mean)}</td>'
            f'<td class="num">[{e.pass1.low * 100:.1f}, {e.pass1.high * 100:.1f}]</td>'
            + "".join(f'<td class="num">{pct(e.pass_k[str(k)]) if str(k) in e.pass_k else "—"}</td>' for k in ks)
            + f'<td class="num">{diff}</td><td class="num">{e.rollouts_used:,}</td><td class="num">{n_tasks}</td>'
            f'<td class="desc">{failures or "—"}</td></tr>')
    return (head + _grading(data) + _img(figures, "evaluation", "pass^1 per variant with 95% intervals")
            + _table(headers, rows) + "</section>")


def _grading(data: ReportData) -> str:
    """A live target's grader (τ²-bench, its reward basis, user simulator and judge), once per distinct one."""
    seen = {e.grading.model_dump_json(): e.grading for e in data.evaluation.values() if e.grading is not None}

    def endpoint(value: dict | None) -> str:
        return "none" if not value else esc(f"{value.get('model')} at {value.get('base_url') or 'its provider'}, "
                                            f"temperature {value.get('temperature')}")

    return "".join(f'<p class="note">Graded live by {esc(g.grader)}: reward basis {esc(", ".join(g.reward_basis))}; '
                   f"user simulator {endpoint(g.user_simulator)}; NL-assertion judge {endpoint(g.judge)}.</p>"
                   for g in seen.values())


def _sample_efficiency(data: ReportData, figures: dict[str, bytes]) -> str:
    head = ('<section id="sample-efficiency"><h2>Sample efficiency</h2><p class="note">TRACE (every adapter and the '
            "gate data) and GRPO directly on the target, at each budget they were evaluated at, on the same validation "
            "episodes; beside them, the test tasks at each one's final budget.</p>")
    se = data.sample_efficiency
    if se is None:
        return head + _missing(data, "sample_efficiency", "no curve measured yet.") + "</section>"
    rows = []
    for label, points in (("TRACE", se.trace), ("GRPO on target", se.grpo_target), ("SWE-RL", se.swe_rl)):
        for p in points:
            rows.append(f"<tr><td>{label}</td>{_num(p.step)}{_num(f'{p.rollouts:,}')}"
                        f'<td class="num">{p.passed} / {p.episodes}</td><td class="num">{pct(p.interval.mean)}</td>'
                        f'<td class="num">[{p.interval.low * 100:.1f}, {p.interval.high * 100:.1f}]</td></tr>')
    table = _table([("method", False), ("step", True), ("rollouts", True), ("passed", True), ("validation", True),
                    ("95% interval", True)], rows)
    notes = [f"Validation episodes: {se.episodes}; intervals are Wilson 95% intervals over them."]
    if se.test:
        notes.append(f"Test: pass^1 on {se.test_tasks} tasks of the target's test split with 95% bootstrap intervals "
                     "(eval/<variant>.json).")
    if se.note:
        notes.append(f"{se.note}.")
    text = "".join(f'<p class="note">{esc(n)}</p>' for n in notes)
    return head + _img(figures, "sample_efficiency", "validation pass rate vs rollouts, and test pass^1") + text + \
        table + "</section>"


def _examples(data: ReportData) -> str:
    head = ('<section id="examples"><h2>Example test tasks: base vs TRACE</h2><p class="note">Tasks where the '
            "base model failed and TRACE passed are shown first. Long texts are cut.</p>")
    if not data.examples:
        return head + _missing(data, "examples", "no test trajectories yet.") + "</section>"
    label = data.trace_variant or "TRACE"
    blocks = [f"<h3>Task {esc(ex.task_id)}</h3><div class=\"pair\">{_episode('base', ex.base)}"
              f"{_episode(label, ex.trace)}</div>" for ex in data.examples]
    return head + "".join(blocks) + "</section>"


def _episode(label: str, t: Trajectory) -> str:
    outcome = (f'<span class="badge pass">passed · reward {t.reward:.2f}</span>' if t.passed else
               f'<span class="badge fail">failed · reward {t.reward:.2f} · {esc(t.termination)}</span>')
    return (f'<div class="episode"><h4><span>{esc(label)}</span>{outcome}</h4>'
            + "".join(_message(m) for m in t.messages) + "</div>")


def _message(m: Message) -> str:
    text = m.content or ""
    if m.role == "system":
        return (f'<details class="msg system"><summary>system prompt · {len(text):,} characters</summary>'
                f'<div class="text">{_truncate(text, 4 * TEXT_LIMIT)}</div></details>')
    if m.role == "tool":
        error = " error" if m.is_error else ""
        return (f'<div class="msg tool{error}"><div class="role">tool result · {esc(m.name or "")}</div>'
                f'<div class="text">{_truncate(text, TEXT_LIMIT)}</div></div>')
    role = "agent" if m.role == "assistant" else m.role
    body = f'<div class="text">{_truncate(text, TEXT_LIMIT)}</div>' if text else ""
    calls = "".join(f'<div class="call">→ <b>{esc(c.function.name)}</b>'
                    f"({_truncate(c.function.arguments, ARGS_LIMIT)})</div>" for c in (m.tool_calls or []))
    return f'<div class="msg {esc(m.role)}"><div class="role">{esc(role)}</div>{body}{calls}</div>'


def _config(data: ReportData) -> str:
    head = '<section id="config"><h2>Run configuration</h2>'
    if data.config_text is None:
        return head + _missing(data, "config", "config.yaml not found.") + "</section>"
    return (head + "<details><summary>config.yaml (resolved)</summary>"
            f"<pre>{esc(data.config_text)}</pre></details></section>")
