"""Quality: does each built-in capability adapter raise its environment's held-out success?

For every capability environment (the four built-in templates on the airline target, or the
directories under --envs), train a LoRA adapter on the embedded tiny agent with
`configs/train-tiny.yaml`, and report the greedy held-out success at step 0 (the base model) and at
the end, the rollouts and the wall-clock time, plus one curve per capability.

    python benchmarks/capability_adapters.py --out /tmp/adapters [--envs envs/] [--config configs/train-tiny.yaml]

Writes <out>/summary.json (a rerun with --only replaces those capabilities' entries and keeps the
others), <out>/curves.png and one adapter directory per capability.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]


def builtin_env_dirs(root: Path, difficulty: int) -> list[Path]:
    from tracerl.contracts import EnvSpec
    from tracerl.envs.synthetic.envdir import write_env_dir
    from tracerl.synthesis.target import load_target
    from tracerl.envs.synthetic.templates import TEMPLATES

    target = load_target("airline")
    return [write_env_dir(root / cap, EnvSpec(capability=cap, template=cap, target="airline", difficulty=difficulty),
                          target) for cap in sorted(TEMPLATES)]


def copied_ids(trajectories) -> dict[str, dict[str, float]]:
    """Of the read and of the write tool calls (by the tools' kinds) that pass an id (a string argument
    named `…_id`), the share whose every id appeared verbatim in an earlier user or tool message."""
    counts = {"read": [0, 0], "write": [0, 0]}
    for t in trajectories:
        kinds = {tool.name: tool.kind for tool in t.tools}
        seen = ""
        for m in t.messages:
            if m.role in ("user", "tool"):
                seen += "\n" + (m.content or "")
            for call in (m.tool_calls or []) if m.role == "assistant" else []:
                ids = [v for k, v in (call.parsed_arguments() or {}).items() if k.endswith("_id") and isinstance(v, str)]
                kind = kinds.get(call.function.name)
                if ids and kind in counts:
                    counts[kind][0] += 1
                    counts[kind][1] += all(v in seen for v in ids)
    return {f"{kind}s": {"calls": n, "copied": round(ok / n, 3) if n else None} for kind, (n, ok) in counts.items()}


def held_out_success(env_dir: Path, base: str, adapter_dir: Path | None, seeds: list[int],
                     max_new_tokens: int) -> dict:
    """Greedy episodes of `base` (+ the adapter in `adapter_dir`) on `seeds` of the environment in
    `env_dir`: the success rate, per task kind the episodes, successes and mean reward terms (a
    template's `reward_breakdown`, e.g. precondition's decision on allowed vs forbidden records), and
    the share of read and of write calls whose ids were copied from the conversation."""
    from collections import defaultdict

    from tracerl.envs.runner import Episode, rollout
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.envs.synthetic.envdir import load_env_dir

    policy = LocalPolicy(*load_model(base), temperature=0.0, max_new_tokens=max_new_tokens)  # a fresh copy
    if adapter_dir is not None:
        policy.load_adapter("adapter", adapter_dir)
    episodes = [Episode(seed=s, adapter=None if adapter_dir is None else "adapter") for s in seeds]
    trajs = rollout(load_env_dir(env_dir), policy, episodes)
    by_kind: dict[str, list] = defaultdict(list)
    for t in trajs:
        by_kind[str(t.info.get("task_kind"))].append(t)
    kinds = {}
    for kind, group in sorted(by_kind.items()):
        terms = sorted({k for t in group for k in t.reward_breakdown})
        kinds[kind] = {"episodes": len(group), "passed": sum(t.passed for t in group),
                       **{k: round(sum(t.reward_breakdown.get(k, 0.0) for t in group) / len(group), 3)
                          for k in terms}}
    return {"success": sum(t.passed for t in trajs) / len(seeds), "by_kind": kinds, "id_copies": copied_ids(trajs)}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        evals = [(row["rollouts_used"], row["eval_success"]) for row in r["rows"] if row.get("eval_success") is not None]
        train = [(row["rollouts_used"], row["reward_mean"]) for row in r["rows"] if row.get("reward_mean") is not None]
        axes[0].plot(*zip(*evals), marker="o", label=r["capability"])
        if train:
            axes[1].plot(*zip(*train), label=r["capability"])
    axes[0].set(title="held-out greedy success", xlabel="rollouts", ylabel="success rate", ylim=(0, 1))
    axes[1].set(title="training reward (mean over the step's rollouts)", xlabel="rollouts", ylabel="reward")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--envs", type=Path, default=None, help="folder of env directories (default: the built-in templates)")
    ap.add_argument("--difficulty", type=int, default=1, help="difficulty of the built-in template envs")
    ap.add_argument("--base", default="tiny-agent")
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "train-tiny.yaml")
    ap.add_argument("--only", nargs="*", default=None, help="capability names to run")
    ap.add_argument("--max-rollouts", type=int, default=None,
                    help="stop each adapter's training after this many rollouts (default: the config's max_steps)")
    ap.add_argument("--final-episodes", type=int, default=0,
                    help="also play base and final adapter greedily on this many held-out seeds (0: skip)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from tracerl.commands.train import train_one
    from tracerl.training.run import capability_dirs

    args.out.mkdir(parents=True, exist_ok=True)
    dirs = capability_dirs(args.envs) if args.envs else builtin_env_dirs(args.out / "envs", args.difficulty)
    if args.only:
        dirs = [d for d in dirs if d.name in args.only]
    console = Console(stderr=True)
    results = []
    for env_dir in dirs:
        out = args.out / "adapters" / env_dir.name
        t0 = time.perf_counter()
        summary = train_one(env_dir, args.base, out, config=args.config, force=False,
                            max_rollouts=args.max_rollouts, max_steps=None, seed=None, adapter=None, server=None,
                            served_model=None, quiet=False, console=console)
        summary["wall_s"] = round(time.perf_counter() - t0, 1)
        summary["rows"] = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        first, last = summary["eval_success_first"], summary["eval_success_last"]
        summary["gain_points"] = None if first is None else round(100 * (last - first), 1)
        if args.final_episodes:
            from tracerl.training.config import load_config

            cfg = load_config(args.config)
            seeds = [cfg.eval_seed_start + i for i in range(args.final_episodes)]
            base_eval = held_out_success(env_dir, args.base, None, seeds, cfg.rollout.max_new_tokens)
            adapter_eval = held_out_success(env_dir, args.base, out, seeds, cfg.rollout.max_new_tokens)
            summary["final_eval"] = {"episodes": args.final_episodes, "base": base_eval, "adapter": adapter_eval,
                                     "gain_points": round(100 * (adapter_eval["success"] - base_eval["success"]), 1)}
        results.append(summary)
        console.print(f"{env_dir.name}: {first} → {last} ({summary['gain_points']} pts) in {summary['wall_s']} s, "
                      f"{summary['rollouts_used']} rollouts" + (f"; on {args.final_episodes} held-out seeds "
                      f"{summary['final_eval']['base']['success']:.3f} → {summary['final_eval']['adapter']['success']:.3f}"
                      if args.final_episodes else ""))
    summary_path = args.out / "summary.json"
    if summary_path.exists():  # keep the capabilities this call did not rerun (--only)
        rerun = {r["capability"] for r in results}
        results = [r for r in json.loads(summary_path.read_text()) if r["capability"] not in rerun] + results
        results.sort(key=lambda r: r["capability"])
    summary_path.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "curves.png")
    print(json.dumps([{k: v for k, v in r.items() if k != "rows"} for r in results], indent=2))


if __name__ == "__main__":
    main()
