"""Per-token decode latency of base, one adapter, token-level MoE and merged adapters, side by side.

    python benchmarks/composition_latency.py                 # CPU defaults (a ~25M-parameter Qwen3)
    python benchmarks/composition_latency.py --device cuda --hidden 2048 --layers 28 --dtype bfloat16

One random-weight Qwen3-architecture model; N random LoRA adapters (rank r on all seven
projections, non-zero B). Every variant runs the same greedy decode: a prefill of `--prompt-len`
tokens for a batch of `--batch` sequences, then `--new-tokens` single-token steps with the KV cache.
The figure is the median time of one decode step — CPU time of the process on CPU (the machines
this runs on are shared, so wall time mostly measures the neighbours), wall time on CUDA — (one new token for every sequence of the batch),
over `--repeats` rounds that interleave the variants (plus one warm-up round).

Variants:
- base: the plain model.
- peft-1: one adapter through PEFT's LoRA layer (the reference single-adapter runtime).
- moe-dense / moe-gather: the composed model, N experts, gates random so tokens spread over all
  slots (the worst case for mixing), both expert strategies of `GatedLoRALinear`.
- router-1: the composed model with one adapter chosen per sequence (task-level top-1).
- merge-lowrank: task-level weighted merge of all N adapters, computed low-rank per sequence.
- merged-weights: W' = W + Σ α B A written into the weights (a plain model again).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from tracerl.models.composed.adapters import LoRAAdapter, LoRAModule
from tracerl.models.composed.composition import compose
from tracerl.models.composed.layers import GatedLoRALinear
from tracerl.models.composed.merge import merge_adapters
from tracerl.models.generation import _forward_signature
from tracerl.models.tiny_agent import TINY_AGENT_DIR

PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def random_adapters(model, count: int, r: int, seed: int) -> list[LoRAAdapter]:
    generator = torch.Generator().manual_seed(seed)
    adapters = []
    for i in range(count):
        modules = {}
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in PROJECTIONS:
                A = torch.randn(r, module.in_features, generator=generator) / module.in_features**0.5
                B = torch.randn(module.out_features, r, generator=generator) * 0.01
                modules[name] = LoRAModule(A=A, B=B, scaling=2.0)
        adapters.append(LoRAAdapter(name=f"cap{i}", path=f"<memory {i}>", base_model_name_or_path=None, base_model_class=None,
                                    r=r, lora_alpha=2.0 * r, target_modules=PROJECTIONS, modules=modules))
    return adapters


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def decode_step_times(model, args, device, forward_kwargs=None) -> list[float]:
    forward_kwargs = forward_kwargs or {}
    cache_name, _ = _forward_signature(model)  # "cache" in recent transformers, else "past_key_values"
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt_len), generator=generator).to(device)
    out = model(input_ids=ids, use_cache=True, **forward_kwargs)
    cache, token = getattr(out, cache_name), out.logits[:, -1].argmax(-1, keepdim=True)
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    times = []
    for _ in range(args.new_tokens):
        sync(device)
        start = clock()
        out = model(input_ids=token, use_cache=True, **{cache_name: cache}, **forward_kwargs)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        sync(device)
        times.append(clock() - start)
        cache = getattr(out, cache_name)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", dest="json_out", default=None, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         head_dim=args.hidden // args.heads, max_position_embeddings=4096)
    base = Qwen3ForCausalLM(config).to(dtype=dtype).eval()
    adapters = random_adapters(base, args.experts, args.rank, seed=1)
    variants: list[tuple[str, torch.nn.Module, dict]] = [("base", copy.deepcopy(base).to(device), {})]

    peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=PROJECTIONS))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    variants.append(("peft-1", peft_model.to(device).eval(), {}))

    composed = copy.deepcopy(base)
    composition = compose(composed.to(device), adapters, mode="moe", gate_init_std=1.0, seed=0)
    moe = composition.composed_model  # routes every call through per-call hooks
    variants += [("moe-dense", moe, {"strategy": "dense"}), ("moe-gather", moe, {"strategy": "gather"})]

    # a task-level composition holds a router, which needs a tokenizer whose router labels are single tokens; the
    # routing weights below are given, so the router never runs: the embedded agent's tokenizer serves
    tokenizer = AutoTokenizer.from_pretrained(TINY_AGENT_DIR)
    task = compose(copy.deepcopy(base).to(device), adapters, mode="merge", tokenizer=tokenizer).composed_model
    one_hot = torch.zeros(args.batch, args.experts + 1, dtype=dtype, device=device)
    one_hot[torch.arange(args.batch), torch.arange(args.batch) % args.experts + 1] = 1
    alpha = torch.full((args.batch, args.experts + 1), 1.0 / (args.experts + 1), dtype=dtype, device=device)
    variants += [("router-1", task, {"routing_weights": one_hot}), ("merge-lowrank", task, {"routing_weights": alpha})]
    merged = merge_adapters(copy.deepcopy(base), adapters, [1.0 / args.experts] * args.experts).to(device)
    variants.append(("merged-weights", merged, {}))

    # rounds interleave the variants, so drift in machine load hits them alike
    times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for round_ in range(args.repeats + 1):
        for name, model, kwargs in variants:
            kwargs = dict(kwargs)
            GatedLoRALinear.strategy = kwargs.pop("strategy", "dense")
            step_times = decode_step_times(model, args, device, kwargs)
            if round_ > 0:  # round 0 warms up
                times[name] += step_times
    GatedLoRALinear.strategy = "dense"
    prompt = torch.randint(0, args.vocab, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad(), composition.routing() as call:
        composed(input_ids=prompt)
    load = torch.bincount(torch.cat([s.reshape(-1).cpu() for s in call.slots]), minlength=args.experts + 1)
    print("moe slot load (one prompt batch, all layers):", [round(x, 3) for x in (load / load.sum()).tolist()])
    results = {name: statistics.median(t) * 1000 for name, t in times.items()}

    report = {
        "config": vars(args), "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
        "ms_per_decode_step": {k: round(v, 3) for k, v in results.items()},
        "ratio_to_base": {k: round(v / results["base"], 3) for k, v in results.items()},
    }
    print(json.dumps(report, indent=2))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
