"""The prepared GPU check: tracerl's scale path on Qwen3-shaped models, nothing downloaded.

    bash scripts/gpu_check.sh [--device cuda] [--out gpu_check.json]      # on one GPU, under 8 minutes
    bash scripts/gpu_check.sh --device cpu --tiny                          # the suite's form (seconds)

For each shape — `qwen3-8b` (hidden 4096, 32 heads, 8 key-value heads, MLP 12288) and `qwen3-30b-a3b`
(hidden 2048, 32 heads, 4 key-value heads, 128 experts of 768, 8 per token), both with Qwen3's 151,936-entry
vocabulary and untied head, `--layers` decoder layers (default 4), random weights in bfloat16 (`--tiny`:
the same architectures a few dozen wide, float32 on the CPU) — it runs tracerl's own code:

1. LoRA r 16 on every projection (`LoraSettings.peft_config_for`: on the MoE shape, attention and the
   fused expert weights), activation checkpointing, the trainer's memory settings;
2. sampling: `--rows` episodes continued by `--new-tokens` tokens through the continuous engine with a
   key-value budget (`kv_cache_tokens`), the adapter on;
3. `--steps` GRPO steps (`GRPOTrainer.update`: micro-batches by `per_device_train_batch_tokens`, chunked
   log-probs, clipped surrogate, AdamW) on `--rows` episodes of `--tokens` tokens each (the sampled
   continuations, the rest of the context random tokens), half of each episode taking loss;
4. the composed model's forward: the trained adapter and a second one composed with gates (moe, routed
   per token; random gates so tokens take both) over one `--tokens`-token episode, and its first tokens
   sampled through the continuous engine.

Per shape and phase: wall seconds and peak memory (CUDA: `max_memory_allocated`; CPU: the process's peak
resident set), written as JSON to `--out` and stdout, with the device's name, the versions, and checks
(finite losses, the adapter moved). Imports torch, transformers, peft and tracerl (whose pure-Python
dependencies scripts/gpu_check.sh finds); no vLLM, no network.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import resource
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    "qwen3-8b": {"kind": "dense", "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "intermediate": 12288},
    "qwen3-30b-a3b": {"kind": "moe", "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128, "intermediate": 6144,
                      "moe_intermediate": 768, "experts": 128, "experts_per_token": 8},
}
TINY = {
    "qwen3-8b": {"kind": "dense", "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "intermediate": 192},
    "qwen3-30b-a3b": {"kind": "moe", "hidden": 32, "heads": 4, "kv_heads": 2, "head_dim": 8, "intermediate": 96,
                      "moe_intermediate": 16, "experts": 8, "experts_per_token": 2},
}
VOCAB = 151_936


def model_config(shape: dict, layers: int, vocab: int):
    from transformers import Qwen3Config, Qwen3MoeConfig

    common = dict(vocab_size=vocab, hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
                  num_hidden_layers=layers, num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                  head_dim=shape["head_dim"], max_position_embeddings=40960, rope_theta=1_000_000.0,
                  tie_word_embeddings=False, rms_norm_eps=1e-6)
    if shape["kind"] == "moe":
        return Qwen3MoeConfig(**common, moe_intermediate_size=shape["moe_intermediate"], num_experts=shape["experts"],
                              num_experts_per_tok=shape["experts_per_token"], norm_topk_prob=True)
    return Qwen3Config(**common)


class Meter:
    """Wall seconds and peak memory of a phase (CUDA: allocated by torch; CPU: the process's resident set)."""

    def __init__(self, device):
        import torch

        self.torch, self.device = torch, device

    def __enter__(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
            self.peak_mib = self.torch.cuda.max_memory_allocated() / 2**20
        else:
            self.peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        self.seconds = time.perf_counter() - self.start
        return False

    def record(self, **extra) -> dict:
        return {"seconds": round(self.seconds, 3), "peak_mib": round(self.peak_mib, 1), **extra}


def check_shape(name: str, shape: dict, args, device, dtype, work: Path) -> dict:
    import torch
    from peft import get_peft_model

    from tracerl.envs.registry import make_env
    from tracerl.models.composed.adapters import load_adapter
    from tracerl.models.composed.composition import compose
    from tracerl.models.continuous import ContinuousSampler
    from tracerl.models.generation import GenerationRequest
    from tracerl.training.backends import LocalBackend
    from tracerl.training.config import TrainConfig
    from tracerl.training.loss import token_logprobs
    from tracerl.training.run import enable_activation_checkpointing
    from tracerl.training.sequences import TrainSequence
    from tracerl.training.trainer import GRPOTrainer

    out: dict = {"shape": shape, "layers": args.layers, "vocab": args.vocab, "tokens": args.tokens, "rows": args.rows}
    cfg = TrainConfig(lora={"r": 16, "lora_alpha": 16}, learning_rate=1e-5, per_device_train_batch_size=args.rows,
                      per_device_train_batch_tokens=2 * args.tokens, gradient_checkpointing=True, seed=0,
                      rollout={"temperature": 1.0, "kv_cache_tokens": args.rows * args.tokens})
    torch.manual_seed(0)
    with Meter(device) as m:
        with torch.device(device):
            base = _build(model_config(shape, args.layers, args.vocab), dtype)
        lora = cfg.lora.peft_config_for(base)
        model = get_peft_model(base, lora, adapter_name="default")
        enable_activation_checkpointing(model.get_base_model())
    out["build"] = m.record(parameters=sum(p.numel() for p in model.parameters()),
                            trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
                            target_modules=sorted(lora.target_modules), target_parameters=list(lora.target_parameters or []))

    # sampling: the continuous engine, the adapter on, a key-value budget
    generator = torch.Generator().manual_seed(1)
    prompt_len = args.tokens - args.new_tokens
    prompts = [torch.randint(0, args.vocab, (prompt_len,), generator=generator).tolist() for _ in range(args.rows)]
    model.eval()
    with Meter(device) as m:
        sampler = ContinuousSampler(model, max_rows=args.rows, kv_cache_tokens=cfg.rollout.kv_cache_tokens,
                                    logprobs_mode="processed_logprobs")
        for k, ids in enumerate(prompts):
            sampler.add(k, GenerationRequest(ids, max_new_tokens=args.new_tokens, temperature=1.0,
                                             generator=torch.Generator(device=device).manual_seed(k)))
        results = {}
        while sampler.busy:
            results.update(sampler.step())
    generated = sum(len(r.token_ids) for r in results.values())
    out["sampling"] = m.record(tokens_generated=generated, tokens_per_second=round(generated / m.seconds, 1),
                               kv_cache_tokens=cfg.rollout.kv_cache_tokens,
                               kv_peak_tokens=sampler.cache.peak_blocks * sampler.cache.block)

    # GRPO steps through the trainer's update
    sequences = []
    for k, ids in enumerate(prompts):
        full = (ids + results[k].token_ids)[: args.tokens]
        full += [0] * (args.tokens - len(full))
        mask = [0] * (args.tokens // 2) + [1] * (args.tokens - args.tokens // 2)
        sequences.append(TrainSequence(full, [0.0] * args.tokens, mask, advantage=1.0 if k % 2 else -1.0))
    with torch.no_grad():
        for s in sequences:  # the sampling weights' log-probs (what the server would report)
            ids = torch.tensor([s.ids], device=device)
            s.old_logprobs = token_logprobs(model, ids, torch.ones_like(ids), 1.0, entropy=False)[0][0].tolist()
    trainer = GRPOTrainer(cfg, model, lambda: make_env("airline"), LocalBackend(_no_rollouts),
                          lambda messages, tools: [], work / f"{name}-run", run_info={})  # update() only
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    steps = []
    for _ in range(args.steps):
        with Meter(device) as m:
            row = trainer.update(copy.deepcopy(sequences))
        steps.append(m.record(loss=row["loss"], entropy=row["entropy"], grad_norm=row["grad_norm"],
                              loss_tokens=row["loss_tokens"]))
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters() if p.requires_grad)
    out["grpo_steps"] = steps
    out["grpo_step_seconds_after_first"] = round(sum(s["seconds"] for s in steps[1:]) / max(1, len(steps) - 1), 3)
    out["adapter_moved"] = moved
    model.save_pretrained(str(work / f"{name}-a"))

    # a second adapter, then the composition of both
    base = model.unload()
    torch.manual_seed(1)
    second = get_peft_model(base, lora, adapter_name="default")
    with torch.no_grad():
        for n, p in second.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.02)
    second.save_pretrained(str(work / f"{name}-b"))
    base = second.unload()
    base.eval()
    with Meter(device) as m:
        composition = compose(base, [load_adapter(work / f"{name}-a", name="cap_a"),
                                     load_adapter(work / f"{name}-b", name="cap_b")], mode="moe",
                              gate_init_std=0.5, seed=0)
    out["compose"] = m.record()
    ids = torch.tensor([sequences[0].ids], device=device)
    with torch.no_grad(), Meter(device) as m:
        logits = composition.composed_model(input_ids=ids).logits
    with torch.no_grad(), composition.routing(record=False) as call:
        composition.model(input_ids=ids[:, :64])
    used = sorted({int(s) for layer in call.slots for s in layer.unique().tolist()})
    out["composed_forward"] = m.record(tokens=args.tokens, finite=bool(torch.isfinite(logits.float()).all()),
                                       slots_routed=used)
    with torch.no_grad(), Meter(device) as m:
        sampler = ContinuousSampler(composition.composed_model, max_rows=args.rows,
                                    kv_cache_tokens=cfg.rollout.kv_cache_tokens)
        for k, ids in enumerate(prompts):
            sampler.add(k, GenerationRequest(ids, max_new_tokens=min(32, args.new_tokens), temperature=0.0))
        while sampler.busy:
            sampler.step()
    out["composed_sampling"] = m.record(rows=args.rows, new_tokens=min(32, args.new_tokens))
    out["checks"] = {
        "losses_finite": all(math.isfinite(s["loss"]) for s in steps),
        "adapter_moved": moved > 0,
        "composed_logits_finite": out["composed_forward"]["finite"],
        "both_adapters_routed": {1, 2} <= set(used),
    }
    del trainer, composition, base, second, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _no_rollouts(greedy: bool, seed: int):
    raise RuntimeError("the check samples through ContinuousSampler, not the trainer's rollouts")


def _build(config, dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config._attn_implementation = "sdpa"
    return model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a few dozen wide, float32, short episodes: the suite's form")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 4; --tiny 2)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per episode (default 4096; --tiny 64)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens sampled per episode (default 256; --tiny 8)")
    ap.add_argument("--rows", type=int, default=None, help="episodes (a GRPO group) per step (default 4; --tiny 2)")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (default 3; --tiny 2)")
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                    help="the models' precision (default bfloat16; --tiny float32)")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary (default Qwen3's 151,936; --tiny 1024)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import peft
    import torch
    import transformers

    from tracerl.models.placement import resolve_device

    device = resolve_device(args.device)
    tiny = args.tiny
    args.layers = args.layers or (2 if tiny else 4)
    args.tokens = args.tokens or (64 if tiny else 4096)
    args.new_tokens = args.new_tokens or (8 if tiny else 256)
    args.rows = args.rows or (2 if tiny else 4)
    args.steps = args.steps or (2 if tiny else 3)
    if device.type == "cpu":
        torch.set_num_threads(1)
    args.vocab = args.vocab or (1024 if tiny else VOCAB)
    dtype = getattr(torch, args.dtype or ("float32" if tiny else "bfloat16"))
    torch.manual_seed(0)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
        "dtype": str(dtype).removeprefix("torch."), "tiny": tiny, "shapes": {},
    }
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for name in args.shapes:
            shape = (TINY if tiny else SHAPES)[name]
            result["shapes"][name] = check_shape(name, shape, args, device, dtype, Path(tmp))
            print(json.dumps({name: {k: result["shapes"][name][k] for k in ("grpo_step_seconds_after_first", "checks")}}),
                  file=sys.stderr, flush=True)
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["passed"] = all(all(s["checks"].values()) for s in result["shapes"].values())
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
