"""Can a linear gate tell the capabilities apart? A per-layer linear probe on the gates' input.

    python benchmarks/gate_probe.py --root /tmp/cap --rollouts /tmp/cap/composed/rollouts.jsonl

The MoE gate of a decoder layer is `Linear(hidden, N+1)` over that layer's RMS-normalised input
hidden state. This fits exactly that (full batch, Adam lr 1e-2, 400 steps, label cross-entropy)
on the base model's hidden states, one probe per layer, from two kinds of training tokens:

- `trajectories`: every token from the first user turn to the end of each rollout in
  --rollouts (labelled by `info.capability`) — the gates' label span before 1b07a17;
- `openings`: the tokens of the first user turn and the generation prompt of each environment's
  training seeds 0..63 — the label span now (`tracerl.composition.examples`).

Each probe is scored on the held-out openings (seeds 1,000,000 + i, i < 64) of every environment
under <root>/envs: token accuracy, and per-prompt accuracy of the majority of that layer's token decisions.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="folder with envs/<capability>/ (capability_adapters.py --out)")
    ap.add_argument("--rollouts", type=Path, required=True, help="labelled rollouts (composition_quality.py writes <out>/rollouts.jsonl)")
    ap.add_argument("--base", default="tiny-agent")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from tracerl.models.composed.composition import rms_normalised
    from tracerl.models.composed.examples import GateExample, prompt_example, user_turn_start
    from tracerl.composition.examples import templated_with_assistant_mask
    from tracerl.models.composed.examples import pad_batch
    from tracerl.core.io import read_jsonl
    from tracerl.core.trajectory import Trajectory
    from tracerl.models.local import load_model
    from tracerl.envs.synthetic.envdir import load_env_dir
    from tracerl.training.run import capability_dirs

    model, tokenizer = load_model(args.base, device="cpu")
    model.eval()
    trajectories = read_jsonl(args.rollouts, Trajectory)
    names = sorted({str(t.info["capability"]) for t in trajectories})
    slot_of = {n: i + 1 for i, n in enumerate(names)}
    envs = {d.name: load_env_dir(d) for d in capability_dirs(args.root / "envs") if d.name in slot_of}

    def whole_trajectory(t: Trajectory) -> GateExample:
        ids = list(t.tokens.ids) if t.tokens is not None and t.tokens.ids else templated_with_assistant_mask(tokenizer, t.messages, t.tools)[0]
        start = user_turn_start(tokenizer, t.messages, t.tools, ids)
        return GateExample(ids, [0] * len(ids), [0] * start + [1] * (len(ids) - start), slot_of[str(t.info["capability"])])

    def openings(seeds) -> list[GateExample]:
        out = []
        for n in names:
            for s in seeds:
                env = envs[n]()
                messages, _ = env.reset(seed=s)
                out.append(prompt_example(tokenizer, messages, env.tools, slot_of[n]))
        return out

    @torch.no_grad()
    def features(examples: list[GateExample]) -> tuple[list[torch.Tensor], list[int]]:
        xs, ys = [], []
        for i in range(0, len(examples), 16):
            chunk = examples[i : i + 16]
            batch = pad_batch(chunk)
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
            layers = [rms_normalised(h) for h in out.hidden_states[:-1]]  # the input of each decoder layer
            mask = batch["label_mask"].bool() & batch["attention_mask"].bool()
            for row, e in enumerate(chunk):
                xs.append(torch.stack([h[row][mask[row]] for h in layers]))  # (layers, tokens, hidden)
                ys.append(e.slot)
        return xs, ys

    def fit(xs, ys, layer: int) -> torch.nn.Linear:
        inputs = torch.cat([x[layer] for x in xs])
        targets = torch.cat([torch.full((x.shape[1],), y) for x, y in zip(xs, ys)])
        probe = torch.nn.Linear(inputs.shape[1], len(names) + 1)
        optimizer = torch.optim.Adam(probe.parameters(), lr=1e-2)
        for _ in range(400):
            loss = F.cross_entropy(probe(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return probe

    @torch.no_grad()
    def score(probe, xs, ys, layer: int) -> tuple[float, float]:
        token, majority = [], []
        for x, y in zip(xs, ys):
            picks = probe(x[layer]).argmax(dim=-1)
            token.append((picks == y).float().mean().item())
            counts = Counter(picks.tolist())
            majority.append(min(counts, key=lambda s: (-counts[s], s)) == y)
        return sum(token) / len(token), sum(majority) / len(majority)

    heldout = features(openings(range(1_000_000, 1_000_064)))
    print("| trained on | layer | held-out token accuracy | held-out majority accuracy |\n|---|---:|---:|---:|")
    for kind, examples in (("trajectories", [whole_trajectory(t) for t in trajectories]), ("openings", openings(range(64)))):
        xs, ys = features(examples)
        for layer in range(len(xs[0])):
            token, majority = score(fit(xs, ys, layer), *heldout, layer)
            print(f"| {kind} | {layer} | {token:.1%} | {majority:.1%} |", flush=True)


if __name__ == "__main__":
    main()
