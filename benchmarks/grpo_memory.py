"""Training memory of one GRPO micro-batch at Qwen3's vocabulary (151,936): whole logits against the chunked
output head and activation checkpointing, side by side, on the CPU.

    python benchmarks/grpo_memory.py [--lengths 512 1024 2048 4096 8192] [--before-up-to 2048] [--rows 1]
                                     [--layers 4] [--hidden 256] [--out FILE]

A random Qwen3-shaped model (vocabulary 151,936 as Qwen3's, untied head as Qwen3-8B's; `--layers`,
`--hidden` small enough for the CPU) in float32 with LoRA r 16 on all seven projections; `--rows`
sequences of each length. One step is `token_logprobs` (temperature 1, entropy logged) → `policy_loss`
(grpo, random advantages, old log-probs = the current ones − 0.05) → backward, in train mode, as the
trainer runs it:

- before: the logits whole (`chunk_elements` unbounded: `model(...).logits`, its float32 log-softmax and,
  for the entropy, its exp over the whole [tokens, vocabulary] table), every layer's activations kept —
  the computation before chunking existed;
- after: the default chunked head (2^27 tokens × vocabulary entries at once: 883 tokens at this
  vocabulary, recomputed in backward) and `gradient_checkpointing: true`.

Each (variant, length) runs in a fresh process after one warm-up step; its peak is the process's peak
resident memory during the measured step minus before it (ru_maxrss), its time the step's wall seconds.
"before" above `--before-up-to` is not run (its whole-vocabulary tensors alone are ≥ 4 × rows × length ×
151,936 × 4 bytes: 10 GB at 4,096). At every length both variants ran, the adapter's gradients are
compared (largest absolute difference, relative to the largest gradient). Prints JSON (and --out), with
the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

VOCAB = 151_936


def load_average() -> list[str]:
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def build(layers: int, hidden: int):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    heads = max(1, hidden // 64)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=64,
                         max_position_embeddings=32768, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(config)
    peft = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.01)  # non-zero: gradients reach every factor
    return peft


def step(model, ids, variant: str):
    import torch

    from tracerl.training.loss import LOGITS_CHUNK_ELEMENTS, BatchCounts, policy_loss, token_logprobs

    chunk = 1 << 62 if variant == "before" else LOGITS_CHUNK_ELEMENTS
    mask = torch.ones_like(ids)
    model.zero_grad(set_to_none=True)
    logp, entropy = token_logprobs(model, ids, mask, 1.0, chunk_elements=chunk, entropy=True)
    advantages = torch.linspace(-1, 1, ids.shape[0]) if ids.shape[0] > 1 else torch.ones(1)
    loss, _ = policy_loss(logp, logp.detach() - 0.05, advantages, mask, BatchCounts(ids.shape[0], int(mask.sum())))
    loss.backward()
    return float((entropy.detach() * mask).sum()), loss.item()


def child(args) -> None:
    """One (variant, length) in this process: warm-up step, then the measured one; JSON on stdout."""
    import torch

    from tracerl.training.run import enable_activation_checkpointing

    torch.set_num_threads(args.threads)
    model = build(args.layers, args.hidden)
    model.train()
    if args.variant == "after":
        enable_activation_checkpointing(model.get_base_model())
    ids = torch.randint(0, VOCAB, (args.rows, args.length), generator=torch.Generator().manual_seed(2))
    step(model, ids[:, :64], args.variant)  # warm-up (kernels, allocator)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    entropy, loss = step(model, ids, args.variant)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    if args.grads:
        torch.save(grads, args.grads)
    print(json.dumps({"variant": args.variant, "length": args.length, "rows": args.rows,
                      "step_seconds": round(seconds, 2), "peak_mib": round((peak - before) / 1024, 1),
                      "process_peak_mib": round(peak / 1024, 1), "loss": loss, "entropy_sum": entropy}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--before-up-to", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", choices=["before", "after"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--grads", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.variant = args.child
        return child(args)
    import tempfile

    import torch

    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "load_average_before": load_average(), "vocab": VOCAB,
              "layers": args.layers, "hidden": args.hidden, "rows": args.rows, "threads": args.threads, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for length in args.lengths:
            got = {}
            for variant in ("before", "after"):
                if variant == "before" and length > args.before_up_to:
                    continue
                grads = Path(tmp) / f"{variant}-{length}.pt"
                command = [sys.executable, __file__, "--child", variant, "--length", str(length), "--rows", str(args.rows),
                           "--layers", str(args.layers), "--hidden", str(args.hidden), "--threads", str(args.threads),
                           "--grads", str(grads)]
                run = subprocess.run(command, capture_output=True, text=True)
                if run.returncode != 0:
                    got[variant] = {"variant": variant, "length": length, "error": run.stderr.strip().splitlines()[-1][:300]}
                else:
                    got[variant] = json.loads(run.stdout.strip().splitlines()[-1])
                result["runs"].append(got[variant])
                print(json.dumps(got[variant]), file=sys.stderr, flush=True)
            if all("error" not in got.get(v, {"error": 1}) for v in ("before", "after")):
                a = torch.load(Path(tmp) / f"before-{length}.pt")
                b = torch.load(Path(tmp) / f"after-{length}.pt")
                worst = max((a[k] - b[k]).abs().max().item() for k in a)
                scale = max(a[k].abs().max().item() for k in a)
                result["runs"].append({"length": length, "grad_max_abs_diff": worst, "grad_max_abs": scale,
                                       "relative": worst / scale})
    result["load_average_after"] = load_average()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
