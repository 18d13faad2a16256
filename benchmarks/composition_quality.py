"""Quality of the composed models: routing accuracy and per-capability success vs each own adapter.

    python benchmarks/capability_adapters.py --out /tmp/cap          # trains one adapter per env
    python benchmarks/composition_quality.py --root /tmp/cap --out /tmp/cap/composed

Reads <root>/envs/<capability>/ (env directories) and <root>/adapters/<capability>/ (PEFT LoRA
adapters of the base). Then, for every capability environment:

1. gate-training data: rollouts of the capability's own adapter on training seeds
   [0, --train-episodes) at temperature --temperature, labelled `info.capability`;
2. `tracerl compose` machinery (`build_composition`) for the modes moe, router and merge (with
   `--target WORKSPACE`, the moe routed at the opening fits its gates to the workspace's failed
   target openings too, as the demo's compose stage does);
3. routing accuracy on held-out prompts (the openings of seeds eval_seed_start + i, i < --eval-episodes:
   the adapters' own held-out seeds), per environment;
4. greedy held-out success of: the base, the capability's own adapter, and each composed model
   (moe with `--moe-routing token opening`: routed per token, and routed at the opening).

The issue's targets: routing accuracy ≥ 90% (moe per-token majority, and the task router), and
each composed model within 5 points of the capability's own adapter on every environment.
Writes <out>/quality.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

EVAL_SEED_START = 1_000_000  # TrainConfig.eval_seed_start: the adapters' own held-out seeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="folder with envs/ and adapters/ (capability_adapters.py --out)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--base", default="tiny-agent")
    ap.add_argument("--train-episodes", type=int, default=64, help="gate-training rollouts per capability")
    ap.add_argument("--eval-episodes", type=int, default=64, help="held-out seeds per capability")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-steps", type=int, default=200, help="gate-training steps")
    ap.add_argument("--gate-batch-size", type=int, default=8, help="sequences per gate-training step")
    ap.add_argument("--label-loss-coef", type=float, default=1.0, help="gate training: weight of the label loss")
    ap.add_argument("--lm-loss-coef", type=float, default=1.0, help="gate training: weight of the LM loss")
    ap.add_argument("--gate-lr", type=float, default=1e-2, help="gate training: learning rate")
    ap.add_argument("--gate-lr-scheduler", default="linear", help="gate training: linear | cosine | constant")
    ap.add_argument("--gate-seeds", type=int, nargs="+", default=[0],
                    help="moe: train the gates once per seed (minibatch order) and report each")
    ap.add_argument("--modes", nargs="*", default=["moe", "router", "merge"])
    ap.add_argument("--moe-routing", nargs="+", default=["token"], choices=["token", "opening"],
                    help="moe: compose routed per token (gates trained per --gate-seeds), at the opening (gates "
                         "fitted to the openings: nothing drawn, one run), or both")
    ap.add_argument("--target", type=Path, default=None, metavar="WORKSPACE",
                    help="a demo workspace (its rollouts/base.jsonl, capabilities.json and labels/): the moe routed at "
                         "the opening fits its gates to its failed target openings too, as the pipeline's compose does")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--all-rollouts", action="store_true", help="the gates' LM loss on failed rollouts too (the label loss takes every rollout's opening anyway)")
    ap.add_argument("--stand-in-adapters", type=float, default=None, metavar="SCALE",
                    help="routing only: random LoRA adapters (A, B ~ N(0, SCALE²)) in place of trained ones, for capabilities without one")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from tracerl.models.composed.composition import LabelledPrompt

    from tracerl.composition.accuracy import routing_accuracy
    from tracerl.models.composed.artifact import load_composed
    from tracerl.composition.build import ComposeOptions, build_composition
    from tracerl.models.composed.policy import ComposedPolicy
    from tracerl.composition.stage import target_lacking
    from tracerl.composition.training import GateTrainingConfig
    from tracerl.contracts import Capability, RoutingAccuracy
    from tracerl.core.io import write_json, write_jsonl
    from tracerl.envs.runner import Episode, rollout
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.envs.synthetic.envdir import load_env_dir, load_env_spec
    from tracerl.training.run import capability_dirs

    args.out.mkdir(parents=True, exist_ok=True)
    if args.stand_in_adapters is not None:
        make_stand_in_adapters(args.root, args.base, args.stand_in_adapters)
    env_dirs = [d for d in capability_dirs(args.root / "envs") if (args.root / "adapters" / d.name / "adapter_config.json").exists()]
    names = [d.name for d in env_dirs]
    make_env = {d.name: load_env_dir(d) for d in env_dirs}
    adapter_dirs = [str(args.root / "adapters" / n) for n in names]
    capabilities = [Capability(name=n, description=load_env_spec(d).description or n.replace("_", " ")) for n, d in zip(names, env_dirs)]
    print(f"capabilities: {names}", flush=True)

    model, tokenizer = load_model(args.base, device="cpu")
    sampler = LocalPolicy(model, tokenizer, temperature=args.temperature, seed=0, max_new_tokens=args.max_new_tokens)
    greedy = LocalPolicy(model, tokenizer, temperature=0.0, seed=0, max_new_tokens=args.max_new_tokens)
    for n, d in zip(names, adapter_dirs):
        sampler.load_adapter(n, d)
    greedy.model = sampler.model  # one PeftModel holding every adapter

    t0 = time.perf_counter()
    rollouts = []
    for n in names:
        trajs = rollout(make_env[n], sampler, [Episode(seed=s, adapter=n) for s in range(args.train_episodes)])
        for t in trajs:
            t.info["capability"] = n
        rollouts += trajs
        print(f"{n}: {sum(t.passed for t in trajs)}/{len(trajs)} training rollouts passed", flush=True)
    write_jsonl(args.out / "rollouts.jsonl", rollouts)

    heldout = {n: [EVAL_SEED_START + i for i in range(args.eval_episodes)] for n in names}
    prompts = []
    for n in names:
        for s in heldout[n]:
            env = make_env[n]()
            messages, _ = env.reset(seed=s)
            prompts.append(LabelledPrompt(messages, env.tools, n))

    def success(policy, n: str, adapter: str | None) -> float:
        trajs = rollout(make_env[n], policy, [Episode(seed=s, adapter=adapter) for s in heldout[n]])
        return sum(t.passed for t in trajs) / len(trajs)

    results: dict = {"capabilities": names, "success": {}, "routing_accuracy": {}, "config": {k: str(v) for k, v in vars(args).items()}}
    evaluate = args.stand_in_adapters is None
    if evaluate:
        results["success"]["base"] = {n: success(greedy, n, None) for n in names}
        results["success"]["own adapter"] = {n: success(greedy, n, n) for n in names}
    print(json.dumps(results["success"], indent=1), flush=True)
    del sampler, greedy, model

    target = target_lacking(args.target / "rollouts" / "base.jsonl", args.target, names) if args.target else []
    runs = []  # (mode, gate seed, moe routing)
    for mode in args.modes:
        if mode != "moe":
            runs.append((mode, 0, "token"))
            continue
        if "token" in args.moe_routing:
            runs += [("moe", seed, "token") for seed in args.gate_seeds]
        if "opening" in args.moe_routing:
            runs.append(("moe", 0, "opening"))
    for mode, seed, routing in runs:
        label = mode if len(args.gate_seeds) == 1 or mode != "moe" else f"moe seed {seed}"
        label = "moe at the opening" if routing == "opening" else label
        out = args.out / label.replace(" ", "-")
        options = ComposeOptions(mode=mode, capabilities=capabilities, trajectories=[str(args.out / "rollouts.jsonl")],
                                 heldout_fraction=0.0, moe_routing=routing, target=target if routing == "opening" else [],
                                 # untrained stand-ins rarely succeed: routing-only runs take the LM loss on every rollout
                                 lm_on_all=args.all_rollouts or args.stand_in_adapters is not None, gate=GateTrainingConfig(max_steps=args.max_steps, per_device_train_batch_size=args.gate_batch_size,
                                                                          label_loss_coef=args.label_loss_coef, lm_loss_coef=args.lm_loss_coef,
                                                                          learning_rate=args.gate_lr, lr_scheduler_type=args.gate_lr_scheduler,
                                                                          logging_steps=max(1, args.max_steps // 10), seed=seed))
        spec = build_composition(adapter_dirs, args.base, out, options, on_gate_log=lambda r: print(f"  gates {r}", flush=True))
        composed = load_composed(out, device="cpu")
        composition = composed.tracerl_composition
        accuracy = routing_accuracy(composition, composed.tracerl_tokenizer, prompts)
        spec.routing_accuracy = RoutingAccuracy.model_validate(accuracy | {
            "method": f"{accuracy['method']} on held-out seeds {EVAL_SEED_START}+i, i < {args.eval_episodes}, per environment"})
        spec.write(out / "composition.json")
        results["routing_accuracy"][label] = accuracy
        print(label, json.dumps(accuracy), flush=True)
        if mode == "moe":
            votes = results.setdefault("moe_votes", {})[label] = votes_by_layer(composition, composed.tracerl_tokenizer, prompts)
            print(f"{label} votes", json.dumps(votes), flush=True)
        if evaluate:
            policy = ComposedPolicy(composed, temperature=0.0, seed=0, name=spec.model_name, max_new_tokens=args.max_new_tokens)
            results["success"][f"composed {label}"] = {n: success(policy, n, None) for n in names}
            print(label, json.dumps(results["success"][f"composed {label}"]), flush=True)

    own = results["success"].get("own adapter", {})
    results["within_5_points"] = {
        variant: all(values[n] >= own[n] - 0.05 for n in names) for variant, values in results["success"].items() if variant.startswith("composed")
    }
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    write_json(args.out / "quality.json", results)
    header = "| variant | " + " | ".join(names) + " |"
    print(header + "\n|---|" + "---:|" * len(names))
    for variant, values in results["success"].items():
        print(f"| {variant} | " + " | ".join(f"{100 * values[n]:.1f}%" for n in names) + " |")
    for mode, acc in results["routing_accuracy"].items():
        print(f"| routing accuracy ({mode}) | " + " | ".join(f"{100 * acc['per_capability'].get(n, 0):.1f}%" for n in names) + " |")
    for label, votes in results.get("moe_votes", {}).items():
        for way, acc in votes.items():
            print(f"| {label} votes: {way} | " + " | ".join(f"{100 * acc.get(n, 0):.1f}%" for n in names) + " |")


def votes_by_layer(composition, tokenizer, prompts) -> dict:
    """Per-capability routing accuracy of the moe gates counted three ways: each layer's
    decisions alone (majority over tokens), every layer × token decision pooled, and per token
    (`prompt_slot`, what routing accuracy reports)."""
    from tracerl.models.composed.composition import gate_votes, prompt_slot

    # one row of votes: `prompt_slot` is then the plain majority over them (ties to the lower slot)
    votes = gate_votes(composition, tokenizer, prompts)
    ways = {f"layer {k}": lambda v, k=k: prompt_slot(v[k : k + 1]) for k in range(len(composition.layers))}
    ways |= {"pooled layer x token": lambda v: prompt_slot(v.reshape(1, -1)), "per token": prompt_slot}
    out = {}
    for way, predict in ways.items():
        hits: dict[str, list[bool]] = {}
        for p, v in zip(prompts, votes, strict=True):
            hits.setdefault(p.capability, []).append(predict(v) == composition.slot_of(p.capability))
        out[way] = {name: sum(h) / len(h) for name, h in sorted(hits.items())}
    return out


def make_stand_in_adapters(root: Path, base: str, scale: float) -> None:
    """Random rank-8 LoRA adapters on all seven projections for env dirs without a trained adapter."""
    from peft import LoraConfig, get_peft_model

    from tracerl.models.local import load_model
    from tracerl.training.run import capability_dirs

    for i, env_dir in enumerate(capability_dirs(root / "envs")):
        out = root / "adapters" / env_dir.name
        if (out / "adapter_config.json").exists():
            continue
        model, _ = load_model(base, device="cpu")
        peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        generator = torch.Generator().manual_seed(i + 1)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=generator) * scale)
        peft_model.save_pretrained(str(out))


if __name__ == "__main__":
    main()
