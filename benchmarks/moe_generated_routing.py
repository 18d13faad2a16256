"""Where does a moe composition route the tokens the model generated (not the opening)?

    python benchmarks/moe_generated_routing.py --composed DIR/q/moe-seed-0 --rollouts DIR/q/rollouts.jsonl

For the first --per-capability rollouts of each capability in --rollouts (labelled
`info.capability`, as composition_quality.py writes them), runs the composed model over the whole
episode and counts, over the tokens the model generated (the LM-loss mask), each token's slot: the
one most of its layers chose (`prompt_slot` on that token alone). Prints, per capability, the share
of generated tokens per slot. Routing accuracy (the openings) says nothing about these tokens.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--composed", required=True, help="a moe composition directory")
    ap.add_argument("--rollouts", required=True, help="labelled rollouts (composition_quality.py's <out>/rollouts.jsonl)")
    ap.add_argument("--per-capability", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from tracerl.models.composed.composition import prompt_slot
    from tracerl.models.composed.artifact import load_composed
    from tracerl.composition.examples import trajectory_example
    from tracerl.models.composed.examples import pad_batch
    from tracerl.core.io import read_jsonl
    from tracerl.core.trajectory import Trajectory

    composed = load_composed(args.composed, device="cpu")
    composition, tokenizer = composed.tracerl_composition, composed.tracerl_tokenizer
    trajectories = read_jsonl(args.rollouts, Trajectory)
    names = composition.slot_names
    for capability in names[1:]:
        counts: Counter = Counter()
        for t in [t for t in trajectories if t.info["capability"] == capability][: args.per_capability]:
            batch = pad_batch([trajectory_example(tokenizer, t, composition.slot_of(capability))])
            with torch.no_grad(), composition.routing() as call:
                composition.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
            votes = torch.stack(call.slots)[:, 0]  # (layers, seq)
            for column in votes[:, batch["loss_mask"][0].bool()].T:
                counts[names[prompt_slot(column[:, None])]] += 1
        total = sum(counts.values())
        print(capability, {slot: f"{n / total:.0%}" for slot, n in counts.most_common()}, flush=True)


if __name__ == "__main__":
    main()
