"""How episodes are sampled: the rollout block every stage that plays episodes shares."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RolloutSettings(BaseModel):
    """How episodes are played. In a run config this is the top-level `rollout:` block, the one place these
    are set for collect, calibrate, train, compose's gate data and eval."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(256, ge=1, description="tokens per assistant turn, every stage (a longer turn is "
                                "cut here); TRL's max_completion_length counts a whole completion instead")
    batch_size: int = Field(64, ge=1, description="episodes in flight at once, every stage: in the continuous "
                            "engine's running batch, or played in lockstep and generated in one batch")
    kv_cache_tokens: int | None = Field(None, ge=16, description="the in-process sampler's key-value cache, in "
                                        "tokens over every episode in flight, every stage (None: each running "
                                        "episode holds room for the longest one, batch_size × longest; fastest, "
                                        "for small models). Set, the cache hands out 16-token blocks as episodes "
                                        "grow and a turn waits until its conversation and max_new_tokens fit; "
                                        "the same tokens either way. Qwen3-8B holds 144 KiB per token in bfloat16 "
                                        "(docs/gpu.md)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of GRPO's rollouts, its old-policy "
                               "log-probs, and compose's gate-data rollouts. Only where sampling must differ is it "
                               "set per stage: collect.temperature and eval.temperature (greedy, 0, by default: they "
                               "measure the agent) and synthesize.temperature (calibration, the reference's 0.7)")
