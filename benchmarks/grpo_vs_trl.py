"""GRPO step time and rollouts/s: tracerl's trainer vs TRL's GRPOTrainer, side by side in one run.

Same tiny Qwen3 (random init, saved once), same tokenizer and chat template, same single-turn task
(“Write the letter X.”; reward = 4 × share of X among the completion's characters, capped at 1),
same settings: LoRA r 8 / alpha 16 on all seven projections, 4 prompts × 8 generations per step,
16 new tokens at temperature 1, lr 2e-3, β 0, loss_type grpo, scale_rewards group, one thread.
Each step is timed in wall seconds and in this process's CPU seconds (on a loaded machine the CPU
figure moves less with the load; the load average before and after each trainer is reported).

    pip install -e '.[trl]'
    python benchmarks/grpo_vs_trl.py [--steps 6] [--warmup 1]

Needs the optional extra `trl` (not a dependency of tracerl).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tracerl.core.messages import Message
from tracerl.envs.base import Env, StepResult
from tracerl.models.tiny import count_parameters, tiny_qwen3, tiny_qwen3_config
from tracerl.models.tokenizer import train_tokenizer

LETTERS = "abcdefghijklmnop"
GROUPS, GENERATIONS, NEW_TOKENS, LR = 4, 8, 16, 2e-3


def prompt_of(seed: int) -> str:
    return f"Write the letter {LETTERS[seed % len(LETTERS)]}."


def letter_reward(text: str, letter: str) -> float:
    return min(1.0, 4 * text.count(letter) / max(len(text), 1))


class SingleTurnLetterEnv(Env):
    """One user turn, one assistant turn, reward as above."""

    name = "letters"
    max_turns = 1

    @property
    def tools(self):
        return []

    def reset(self, seed=None, options=None):
        self.letter = LETTERS[(seed or 0) % len(LETTERS)]
        return [Message.user(prompt_of(seed or 0))], {"task_id": str(seed)}

    def step(self, message: Message) -> StepResult:
        reward = letter_reward(message.content or "", self.letter)
        return [], reward, True, False, {"termination": "agent_stop", "reward_breakdown": {}}


def build_base(directory: Path) -> str:
    corpus = [prompt_of(i) + " " + LETTERS[i % len(LETTERS)] * 5 for i in range(64)]
    tok = train_tokenizer(corpus, vocab_size=320)
    model = tiny_qwen3(tiny_qwen3_config(len(tok), hidden_size=64, num_hidden_layers=2,
                                         max_position_embeddings=256), seed=0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)


def run_tracerl(base: str, steps: int, out: Path) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds) of each step."""
    from tracerl.training.config import TrainConfig
    from tracerl.training.run import build_trainer

    cfg = TrainConfig(num_generations=GENERATIONS, groups_per_step=GROUPS, max_steps=steps, learning_rate=LR,
                      rollout={"max_new_tokens": NEW_TOKENS}, eval_episodes=0, max_resample_tries=1, loss_type="grpo",
                      per_device_train_batch_size=GROUPS * GENERATIONS, save_steps=steps, seed=0,
                      lora={"r": 8, "lora_alpha": 16})
    cpu = [time.process_time()]
    trainer = build_trainer(cfg, base, SingleTurnLetterEnv, out, on_step=lambda row: cpu.append(time.process_time()))
    cpu[0] = time.process_time()
    rows = trainer.train()
    steps = [r for r in rows if r["step"] > 0]
    print("tracerl rollout / update seconds per step:",
          [(r["rollout_seconds"], r["update_seconds"]) for r in steps])
    return [r["seconds"] for r in steps], [b - a for a, b in zip(cpu, cpu[1:])]


def run_trl(base: str, steps: int, out: Path) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds) of each step."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    rows = [{"prompt": [{"role": "user", "content": prompt_of(i)}], "letter": LETTERS[i % len(LETTERS)]}
            for i in range(GROUPS * steps * 2)]

    def reward(completions, letter, **_: Any) -> list[float]:
        return [letter_reward(c[0]["content"], x) for c, x in zip(completions, letter, strict=True)]

    times: list[float] = []
    cpu: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)
            cpu.append(time.process_time() - self.c0)

    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=GROUPS * GENERATIONS, num_generations=GENERATIONS,
        max_completion_length=NEW_TOKENS, learning_rate=LR, beta=0.0, loss_type="grpo", scale_rewards="group",
        epsilon=0.2, epsilon_high=0.28, temperature=1.0, max_steps=steps, logging_steps=1, report_to="none",
        use_cpu=True, bf16=False, save_strategy="no", seed=0, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, dataloader_num_workers=0, shuffle_dataset=False,
    )
    peft = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, peft_config=peft, callbacks=[Clock()])
    trainer.train()
    return times, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1, help="first steps left out of the timing")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import trl

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = build_base(tmp / "base")
        params = count_parameters(tiny_qwen3(tiny_qwen3_config(320, hidden_size=64, num_hidden_layers=2)))
        results = {}
        for name, fn in (("tracerl", run_tracerl), ("trl", run_trl)):
            load = os.getloadavg()[0]
            times, cpu = (x[args.warmup:] for x in fn(base, args.steps, tmp / name))
            step = statistics.median(times)
            results[name] = {"step_s_median": round(step, 4), "step_s_all": [round(t, 4) for t in times],
                             "rollouts_per_s": round(GROUPS * GENERATIONS / step, 1),
                             "step_cpu_s_median": round(statistics.median(cpu), 4),
                             "step_cpu_s_all": [round(t, 4) for t in cpu],
                             "load_average": [round(load, 2), round(os.getloadavg()[0], 2)]}
    report = {
        "task": "single-turn letters", "params": params, "groups": GROUPS, "generations": GENERATIONS,
        "new_tokens": NEW_TOKENS, "steps_timed": args.steps - args.warmup, "threads": 1,
        "torch": torch.__version__, "trl_version": trl.__version__, "python": platform.python_version(),
        **results, "trl_over_tracerl_step_time": round(results["trl"]["step_s_median"] / results["tracerl"]["step_s_median"], 2),
        "trl_over_tracerl_step_cpu": round(results["trl"]["step_cpu_s_median"] / results["tracerl"]["step_cpu_s_median"], 2),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
