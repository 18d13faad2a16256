"""The server under load: do oversized prompts stall everyone else?

    python benchmarks/serve_load.py [--model tiny-agent] [--normal 8] [--oversized 4] [--seconds 20]
                                    [--oversized-kb 950] [--max-tokens 16] [--out FILE.json]

Starts `tracerl serve` (a subprocess with one torch thread, loopback, 1 MB request limit) and, on loopback, `--normal`
clients that each send, one after the other, an airline opening (system prompt, user turn, the
domain's tools) to /v1/chat/completions (greedy, `--max-tokens`), for `--seconds`:

1. alone: only the normal clients;
2. with oversized prompts: the same, while `--oversized` clients each send, one after the other, a
   chat request whose user turn is `--oversized-kb` KB of text (far past the model's context: the
   answer is 400).

For each phase: the normal requests' count, latency p50 / p95 / max (seconds), requests/s, and any
non-200 answer; the oversized requests' count, status codes and latency p50 / p95. The load average
of the machine is recorded at start and end (the figures are wall-clock).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def opening() -> dict:
    from tracerl.envs.registry import make_env

    env = make_env("airline")
    messages, _ = env.reset(seed=env.task_seeds(1)[0])
    return {"messages": [m.to_openai() for m in messages], "tools": [t.to_openai() for t in env.tools]}


def start_server(model: str, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "tracerl.cli", "serve", "--model", model, "--port", str(port),
               "--max-request-bytes", "1000000", "--max-tokens", "64", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one torch thread: two fight over a shared machine
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the server did not start: {proc.stderr.read().decode()[-2000:]}")


def client_loop(url: str, body: bytes, stop: threading.Event, out: list[tuple[float, int]]) -> None:
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            status = client.post(url, content=body, headers={"content-type": "application/json"}).status_code
            out.append((time.perf_counter() - t0, status))


def phase(url: str, normal_body: bytes, big_body: bytes, normal: int, oversized: int, seconds: float) -> dict:
    stop = threading.Event()
    normal_out: list[tuple[float, int]] = []
    big_out: list[tuple[float, int]] = []
    threads = [threading.Thread(target=client_loop, args=(url, normal_body, stop, normal_out)) for _ in range(normal)]
    threads += [threading.Thread(target=client_loop, args=(url, big_body, stop, big_out)) for _ in range(oversized)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    lat = [s for s, code in normal_out if code == 200]
    big = [s for s, _ in big_out]
    return {
        "normal": {"requests": len(normal_out), "ok": len(lat), "other_status": sorted({c for _, c in normal_out if c != 200}),
                   "p50_s": percentile(lat, 0.5), "p95_s": percentile(lat, 0.95), "max_s": max(lat, default=None),
                   "mean_s": statistics.fmean(lat) if lat else None, "requests_per_s": len(lat) / wall},
        "oversized": {"requests": len(big_out), "status": sorted({c for _, c in big_out}),
                      "p50_s": percentile(big, 0.5), "p95_s": percentile(big, 0.95)},
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-agent")
    parser.add_argument("--normal", type=int, default=8)
    parser.add_argument("--oversized", type=int, default=4)
    parser.add_argument("--oversized-kb", type=int, default=950)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--port", type=int, default=18931)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load_start = os.getloadavg()
    chat = opening()
    normal_body = json.dumps({"model": args.model, **chat, "max_tokens": args.max_tokens, "temperature": 0}).encode()
    words = ("the quick brown fox jumps over the lazy dog " * (args.oversized_kb * 1024 // 44 + 1))[: args.oversized_kb * 1024]
    big_body = json.dumps({"model": args.model, "messages": [chat["messages"][0], {"role": "user", "content": words}],
                           "max_tokens": args.max_tokens}).encode()
    proc = start_server(args.model, args.port)
    url = f"http://127.0.0.1:{args.port}/v1/chat/completions"
    try:
        httpx.post(url, content=normal_body, headers={"content-type": "application/json"}, timeout=120)  # warm-up
        result = {
            "settings": vars(args) | {"out": str(args.out) if args.out else None, "oversized_body_bytes": len(big_body),
                                      "normal_body_bytes": len(normal_body)},
            "alone": phase(url, normal_body, big_body, args.normal, 0, args.seconds),
            "with_oversized": phase(url, normal_body, big_body, args.normal, args.oversized, args.seconds),
            "load_average": {"start": load_start, "end": os.getloadavg()},
        }
    finally:
        proc.terminate()
        proc.wait(30)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
