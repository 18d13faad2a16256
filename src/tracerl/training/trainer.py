"""Multi-turn GRPO on a LoRA adapter: sample groups, score, filter, update, evaluate, checkpoint.

One step:
1. sample `groups_per_step` groups (each: `num_generations` episodes reset with the same seed,
   the first `hint_fraction` of them with the environment's hint), sharded across ranks and
   all-gathered; while fewer than `min_informative_fraction` of the groups are informative, sample
   another round (at most `max_resample_tries` rounds) — every rollout counts toward the budget;
2. advantages per group (TRL's `scale_rewards`), constant groups dropped;
3. training sequences (hint stripped from the prompt), sharded across ranks;
4. `num_iterations` optimizer steps over the batch: clipped surrogate with the sampler's
   log-probs, gradients summed across ranks, clipped to `max_grad_norm`, AdamW;
5. save the adapter, hot-swap it into the rollout backend, log a metrics row, checkpoint.

Every evaluation (step 0, every `eval_steps`, the last step) also keeps the adapter it evaluated as
`snapshots/step_<n>/`: what TRACE's sample-efficiency curve composes at intermediate budgets.

Under `shard: fsdp2` (`training.fsdp`) every rank runs the same forwards: a rank
with fewer micro-batches runs a zero-weighted one and the shared prompt is not run apart. Its rollouts
come from servers (`build_trainer` refuses in-process sampling, which would gather the whole model on
every rank); a trainer built with a local backend anyway samples inside `full_parameters`.

Every random draw is seeded from (seed, step, round, rank), so a resumed run repeats exactly what the
uninterrupted run would have done.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from pydantic import ValidationError

from tracerl.contracts import TrainRun
from tracerl.core.errors import InputError
from tracerl.core.io import atomic_write_text
from tracerl.core.messages import Message
from tracerl.core.policy import Policy
from tracerl.core.trajectory import Trajectory
from tracerl.envs.base import Env
from tracerl.envs.runner import Episode, rollout
from tracerl.training import checkpoint as ckpt
from tracerl.training.advantages import group_advantages, informative_groups
from tracerl.training.config import TrainConfig
from tracerl.training.distributed import (
    World,
    all_gather,
    all_reduce_grads_,
    all_reduce_sum_,
    barrier,
)
from tracerl.training.fsdp import (
    FullState,
    full_parameters,
    full_tensor,
    is_sharded,
    load_sharded_checkpoint,
)
from tracerl.training.loss import (
    BatchCounts,
    policy_loss,
    shared_prefix_length,
    token_logprobs,
)
from tracerl.training.sequences import (
    RenderPrompt,
    TrainSequence,
    collate,
    micro_batches,
    training_sequence,
)


class RolloutBackend(Protocol):
    """Where rollouts come from: the training model itself, or a server that hot-swaps the adapter."""

    adapter: str  # the adapter name the sessions sample with
    needs_adapter_files: bool  # True: save the adapter after every step and call after_step with its folder
    samples_with_model: bool  # True: rollouts run forwards of the training model (a sharded one is gathered first)

    def policy(self, *, greedy: bool, seed: int) -> Policy:
        """A policy sampling with the current adapter, its generators seeded from `seed` (greedy: for evaluation)."""
        ...

    def after_step(self, adapter_dir: Path) -> None:
        """Make the adapter just saved in `adapter_dir` the one that samples next."""
        ...

    def follow_after_step(self) -> None:
        """On the other ranks while rank 0 runs `after_step`, under FSDP2: the same forwards of the training model
        (each is a collective), results unused."""
        ...


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any parts, stable across processes and Python versions."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass
class StepSample:
    groups: list[list[Trajectory]] = field(default_factory=list)  # [group][generation]
    rounds: int = 0


def run_changes(saved: TrainRun, config: TrainConfig, *, base: str, env: str, env_digest: str | None,
                dtype: str | None = None) -> list[str]:
    """What differs between a saved run and one about to resume it: config fields (but the stopping
    rules max_steps and max_rollouts), then 'base', then the environment — a synthesized one by its
    content ('env content': its digest), however its folder is spelled (a run `tracerl train` wrote into a
    workspace resumes as its stage); another by its name ('env') — and 'dtype' (a file that did not
    record it matches any)."""
    free = {"max_steps", "max_rollouts"}
    try:  # a field the saved run predates counts as its default
        saved_config = TrainConfig.model_validate(saved.config).model_dump()
    except ValidationError:
        saved_config = saved.config
    before = {k: v for k, v in saved_config.items() if k not in free}
    now = {k: v for k, v in config.model_dump().items() if k not in free}
    changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    changed += ["base"] if saved.base != base else []
    changed += ["dtype"] if None not in (saved.dtype, dtype) and saved.dtype != dtype else []
    if saved.env_digest is not None or env_digest is not None:
        return changed + (["env content"] if saved.env_digest != env_digest else [])
    return changed + (["env"] if saved.env != env else [])


class GRPOTrainer:
    """Trains the (active, trainable) LoRA adapter of a PEFT `model` on the environment built by `make_env`."""

    def __init__(
        self,
        config: TrainConfig,
        model: torch.nn.Module,
        make_env: Callable[[], Env],
        backend: RolloutBackend,
        render_prompt: RenderPrompt,
        out: str | Path,
        *,
        pad_id: int = 0,
        world: World = World(),
        run_info: dict[str, Any],
        on_step: Callable[[dict[str, Any]], None] | None = None,
        make_eval_env: Callable[[], Env] | None = None,
    ):
        self.cfg = config
        self.model = model
        self.make_env = make_env
        self.make_eval_env = make_eval_env or make_env  # a target's held-out split, when training on its train split
        self.backend = backend
        self.render_prompt = render_prompt
        self.out = Path(out)
        self.pad_id = pad_id
        self.world = world
        self.run_info = run_info  # TrainRun's fields but the config: base, env, init_adapter, rollouts, world_size
        self.on_step = on_step
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.sharded = is_sharded(model)  # FSDP2: parameters are DTensor shards, gradients reduce-scattered in backward
        self.device = next(model.parameters()).device
        if not self.params:
            raise ValueError("the model has no trainable parameters: wrap it with a LoRA adapter first")
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
            weight_decay=config.weight_decay,
        )
        self.state = ckpt.TrainState()
        self.metrics: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ run ---------------------
    def train(self, resume: bool = False) -> list[dict[str, Any]]:
        """Run to `max_steps` (or until the rollout budget is spent); returns the metrics rows."""
        self.out.mkdir(parents=True, exist_ok=True)
        if resume and (found := ckpt.latest_checkpoint(self.out)) is not None:
            self._check_same_run()
            load = load_sharded_checkpoint if self.sharded else ckpt.load_checkpoint
            self.state = load(found, self.model, self.optimizer, self.world.rank)
            self.metrics = ckpt.checkpoint_metrics(found, self.state, self.out / "metrics.jsonl")
            if self.world.is_main:
                # rows the killed run logged after its checkpoint are redone: drop them now, not at the next step
                atomic_write_text(self.out / "metrics.jsonl", ckpt.metrics_text(self.metrics))
                ckpt.drop_snapshots_after(self.out, self.state.step)
                ckpt.remove_temporaries(self.out)
            self._swap_in(found / "adapter")
        else:
            if self.world.is_main:
                TrainRun(config=self.cfg.model_dump(), **self.run_info).write(self.out / "train_config.json")
            if self.backend.needs_adapter_files:  # the server samples with the initial adapter too
                self._save_adapter(self.out)
                self._swap_in(self.out)
            barrier(self.world)
        if self.state.step == 0 and not self.metrics and self.cfg.eval_episodes > 0:
            success = self.evaluate()
            self._snapshot(0)
            self._log({"step": 0, "rollouts_used": 0, "eval_success": success, "eval_episodes": self.cfg.eval_episodes})
            self._checkpoint()
        while self.state.step < self.cfg.max_steps and self._budget_allows_step():
            self._log(self.step())
            if self.state.step % self.cfg.save_steps == 0 or self.state.step == self.cfg.max_steps:
                self._checkpoint()
        self._save_adapter(self.out)
        barrier(self.world)
        return self.metrics

    def _check_same_run(self) -> None:
        """A resumed run must be the same run: same config (the stopping rules may change), base and env (and its content)."""
        saved_path = self.out / "train_config.json"
        if not saved_path.exists():
            return
        changed = run_changes(TrainRun.read(saved_path), self.cfg, base=self.run_info["base"], env=self.run_info["env"],
                              env_digest=self.run_info.get("env_digest"), dtype=self.run_info.get("dtype"))
        if changed:
            raise InputError(f"resuming with different settings ({', '.join(changed)}); "
                             "only max_steps and max_rollouts may change", path=str(saved_path))

    def step(self) -> dict[str, Any]:
        """One GRPO step; returns its metrics row."""
        cfg, t0 = self.cfg, time.perf_counter()
        step = self.state.step + 1
        sample = self.sample_step(step)
        t_sampled = time.perf_counter()
        rewards = torch.tensor([[t.reward for t in g] for g in sample.groups], dtype=torch.float64)
        adv = group_advantages(rewards, cfg.scale_rewards)
        keep = informative_groups(rewards)
        sequences = [
            training_sequence(traj, float(adv[g, i]), self._hint_free_prompt(traj), self.render_prompt)
            for g in range(len(sample.groups)) if keep[g]
            for i, traj in enumerate(sample.groups[g])
        ]
        row: dict[str, Any] = {
            "step": step,
            "rollouts_used": self.state.rollouts_used,
            "reward_mean": rewards.mean().item(),
            "reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            "success_rate": sum(t.passed for g in sample.groups for t in g) / rewards.numel(),
            "groups_sampled": len(sample.groups),
            "informative_groups": int(keep.sum()),
            "sampling_rounds": sample.rounds,
        }
        torch.manual_seed(derive_seed(cfg.seed, step, "update", self.world.rank))  # LoRA dropout
        row.update(self.update(sequences))
        row["rollout_seconds"] = round(t_sampled - t0, 3)
        row["update_seconds"] = round(time.perf_counter() - t_sampled, 3)
        self.state.step = step
        if self.backend.needs_adapter_files:
            self._save_adapter(self.out)
            self._swap_in(self.out)
        barrier(self.world)
        last = step == cfg.max_steps or not self._budget_allows_step()
        if cfg.eval_episodes > 0 and (step % cfg.eval_steps == 0 or last):
            row["eval_success"] = self.evaluate()
            row["eval_episodes"] = cfg.eval_episodes
            self._snapshot(step)
        row["seconds"] = round(time.perf_counter() - t0, 3)
        return row

    # ------------------------------------------------------------- sampling ---------------------
    def sample_step(self, step: int) -> StepSample:
        """The groups of one step (all ranks' rollouts, in group order), resampling while uninformative."""
        cfg, sample = self.cfg, StepSample()
        per_round = cfg.groups_per_step * cfg.num_generations
        for round_ in range(cfg.max_resample_tries):
            if round_ > 0 and cfg.max_rollouts is not None and self.state.rollouts_used + per_round > cfg.max_rollouts:
                break
            sample.groups += self._sample_round(step, round_)
            sample.rounds += 1
            self.state.rollouts_used += per_round
            rewards = torch.tensor([[t.reward for t in g] for g in sample.groups])
            if int(informative_groups(rewards).sum()) >= cfg.min_informative_fraction * cfg.groups_per_step:
                break
        return sample

    def _sample_round(self, step: int, round_: int) -> list[list[Trajectory]]:
        cfg = self.cfg
        rng = random.Random(derive_seed(cfg.seed, step, round_, "seeds"))
        heldout = set(cfg.heldout_seeds())
        seeds: list[int] = []
        while len(seeds) < cfg.groups_per_step:  # a held-out seed is drawn again: it is never trained on
            seed = rng.randrange(cfg.train_seeds)
            if seed not in heldout:
                seeds.append(seed)
        mine = self.world.shard(list(range(cfg.groups_per_step)))
        episodes = [
            Episode(seed=seeds[g], options={"hint": True} if i < cfg.hinted_per_group else {},
                    adapter=self.backend.adapter)
            for g in mine for i in range(cfg.num_generations)
        ]
        policy_seed = derive_seed(cfg.seed, step, round_, "sample", self.world.rank)
        torch.manual_seed(policy_seed)
        self.model.eval()
        with torch.no_grad(), self._sampling():
            trajs = rollout(self.make_env, self.backend.policy(greedy=False, seed=policy_seed), episodes,
                            batch_size=cfg.rollout.batch_size)
        n = cfg.num_generations
        local = {g: trajs[k * n:(k + 1) * n] for k, g in enumerate(mine)}
        merged: dict[int, list[Trajectory]] = {}
        for part in all_gather(self.world, local):
            merged.update(part)
        return [merged[g] for g in range(cfg.groups_per_step)]

    def _hint_free_prompt(self, traj: Trajectory) -> list[Message] | None:
        """The opening messages of `traj`'s task without the hint, or None if it was sampled without one."""
        if not traj.info.get("hint"):
            return None
        return self.make_env().reset(seed=traj.seed)[0]  # the same task's opening, reset without the hint

    # --------------------------------------------------------------- update ---------------------
    def update(self, sequences: list[TrainSequence]) -> dict[str, Any]:
        """`num_iterations` optimizer steps on `sequences` (the whole batch; this rank trains its shard)."""
        cfg = self.cfg
        counts = BatchCounts(sequences=len(sequences), tokens=sum(s.num_loss_tokens for s in sequences))
        if not sequences or counts.tokens == 0:
            return {"loss": None, "clip_ratio": None, "approx_kl": None, "kl": None, "entropy": None,
                    "grad_norm": None, "trained_sequences": 0}
        shard = self.world.chunk(sequences)  # contiguous: a micro-batch holds whole groups (shared prompts)
        micro = micro_batches(shard, cfg.per_device_train_batch_size, cfg.per_device_train_batch_tokens)
        filler = sequences[:1]  # what a sharded rank with fewer micro-batches runs (weight 0) to keep in step
        self._prepare_old_logprobs(micro, filler)
        refs = self._reference_logprobs(micro, filler) if cfg.beta > 0 else [None] * len(micro)
        fillers = self._forwards_in_step(len(micro)) - len(micro)
        self.model.train()
        totals = torch.zeros(6, dtype=torch.float64, device=self.device)  # loss, tokens, clipped, approx_kl, kl, entropy
        grad_norm = 0.0
        for _ in range(cfg.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            totals.zero_()
            for part, ref in zip(micro, refs, strict=True):
                batch = collate(part, self.pad_id).to(self.device)
                logp, entropy = self._logprobs(batch, entropy=True, training=True)
                loss, stats = policy_loss(
                    logp, batch.old_logprobs, batch.advantages, batch.loss_mask, counts,
                    loss_type=cfg.loss_type, epsilon=cfg.epsilon, epsilon_high=cfg.clip_high, beta=cfg.beta,
                    ref_logp=ref, max_completion_length=cfg.max_completion_length,
                )
                loss.backward()
                totals += torch.tensor([loss.item(), stats["tokens"].item(), stats["clipped"].item(),
                                        stats["approx_kl"].item(), stats["kl"].item(),
                                        (entropy.detach() * batch.loss_mask).sum().item()],
                                       dtype=torch.float64, device=self.device)
            for _ in range(fillers):
                (self._logprobs(collate(filler, self.pad_id).to(self.device), training=True)[0].sum() * 0.0).backward()
            if not self.sharded:  # FSDP2 summed them in backward
                all_reduce_grads_(self.world, self.params)
            grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)).item()
            self.optimizer.step()
            all_reduce_sum_(self.world, [totals])
        self.model.eval()
        tokens = max(totals[1].item(), 1.0)
        return {
            "loss": totals[0].item(), "clip_ratio": totals[2].item() / tokens,
            "approx_kl": totals[3].item() / tokens, "kl": totals[4].item() / tokens,
            "entropy": totals[5].item() / tokens, "grad_norm": grad_norm,
            "trained_sequences": counts.sequences, "loss_tokens": counts.tokens,
        }

    def _logprobs(self, batch, *, entropy: bool = False, training: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token log-probs (and with `entropy`, the entropies) of a micro-batch; the prompt the rows share runs
        once — but sharded (one forward per micro-batch, so every rank's forwards pair up) and in a
        gradient-checkpointed training forward (a layer recomputed in backward keeps no KV cache)."""
        apart = self.sharded or (training and self.cfg.gradient_checkpointing)
        prefix = 0 if apart else shared_prefix_length(batch.ids, batch.attention_mask, batch.loss_mask)
        return token_logprobs(self.model, batch.ids, batch.attention_mask, self.cfg.rollout.temperature, prefix_len=prefix,
                              entropy=entropy)

    @torch.no_grad()
    def _prepare_old_logprobs(self, micro: list[list[TrainSequence]], filler: list[TrainSequence]) -> None:
        """Hinted rollouts: the sampling weights' log-probs on the hint-free context (see sequences.py)."""
        self.model.eval()
        hinted_parts = [h for h in ([s for s in part if s.hinted] for part in micro) if h]
        runs = self._forwards_in_step(len(hinted_parts))  # agreed before any forward: a forward is a collective
        for hinted in hinted_parts:
            batch = collate(hinted, self.pad_id).to(self.device)
            logp, _ = self._logprobs(batch)
            for i, s in enumerate(hinted):
                s.old_logprobs = logp[i, : len(s.ids)].tolist()
                s.hinted = False
        self._fill_forwards(runs - len(hinted_parts), filler)

    @torch.no_grad()
    def _reference_logprobs(self, micro: list[list[TrainSequence]], filler: list[TrainSequence]) -> list[torch.Tensor]:
        """The base model's log-probs (adapter disabled) for the KL term."""
        self.model.eval()
        out = []
        runs = self._forwards_in_step(len(micro))
        with self.model.disable_adapter():
            for part in micro:
                batch = collate(part, self.pad_id).to(self.device)
                out.append(self._logprobs(batch)[0])
            self._fill_forwards(runs - len(micro), filler)
        return out

    def _forwards_in_step(self, mine: int) -> int:
        """How many forwards every rank runs where this one needs `mine`: sharded, the most any rank needs
        (each forward gathers the shards, a collective every rank must join); otherwise `mine`.
        Itself a collective: call it before the forwards."""
        return max(all_gather(self.world, mine)) if self.sharded else mine

    @torch.no_grad()
    def _fill_forwards(self, count: int, filler: list[TrainSequence]) -> None:
        """`count` forwards of `filler`, results unused: a sharded rank keeping in step with the busiest."""
        for _ in range(count):
            self._logprobs(collate(filler, self.pad_id).to(self.device))

    def _sampling(self):
        """Where rollouts run: a sharded model sampling locally is gathered whole (ranks sample different forwards)."""
        return full_parameters(self.model) if self.sharded and self.backend.samples_with_model else nullcontext()

    # ----------------------------------------------------------- evaluation ---------------------
    @torch.no_grad()
    def evaluate(self) -> float:
        """Greedy success rate of the current adapter on the held-out seeds."""
        cfg = self.cfg
        seeds = self.world.shard(cfg.heldout_seeds())
        self.model.eval()
        with self._sampling():
            trajs = rollout(self.make_eval_env, self.backend.policy(greedy=True, seed=cfg.seed),
                            [Episode(seed=s, adapter=self.backend.adapter) for s in seeds],
                            batch_size=cfg.rollout.batch_size)
        passed = sum(sum(t.passed for t in part) for part in all_gather(self.world, trajs))
        return passed / max(cfg.eval_episodes, 1)

    # -------------------------------------------------------------- records ---------------------
    def _budget_allows_step(self) -> bool:
        budget = self.cfg.max_rollouts
        return budget is None or self.state.rollouts_used + self.cfg.groups_per_step * self.cfg.num_generations <= budget

    def _log(self, row: dict[str, Any]) -> None:
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.metrics.append(row)
        self.state.metrics_rows = len(self.metrics)
        if self.world.is_main:
            atomic_write_text(self.out / "metrics.jsonl", ckpt.metrics_text(self.metrics))
        if self.on_step is not None:
            self.on_step(row)

    def _checkpoint(self) -> None:
        rngs = all_gather(self.world, ckpt.rng_state())
        model, optimizer = self.model, self.optimizer
        if self.sharded:
            model = optimizer = FullState.gather(self.model, self.optimizer)
        if self.world.is_main:
            ckpt.save_checkpoint(self.out, model, optimizer, self.state, rngs, self.metrics)
            ckpt.save_adapter(model, self.out)
        barrier(self.world)

    def _save_adapter(self, directory: Path) -> None:
        """Rank 0 writes the adapter into `directory` (every rank calls this: a sharded adapter is gathered first)."""
        model = FullState.gather(self.model, None) if self.sharded else self.model
        if self.world.is_main:
            ckpt.save_adapter(model, directory)

    def _snapshot(self, step: int) -> None:
        """Rank 0 keeps the adapter as `snapshots/step_<step>/` (every rank calls this: a sharded adapter is gathered)."""
        model = FullState.gather(self.model, None) if self.sharded else self.model
        if self.world.is_main:
            ckpt.save_snapshot(model, self.out, step)
        barrier(self.world)

    def _swap_in(self, adapter_dir: Path) -> None:
        """Rank 0 makes the adapter in `adapter_dir` the one that samples next (every rank calls this)."""
        if self.world.is_main:
            self.backend.after_step(adapter_dir)
        elif self.sharded:  # rank 0's served-policy check runs forwards of the sharded model: join them
            self.backend.follow_after_step()
        barrier(self.world)
