"""Tiny Qwen3-architecture models built from a config (random weights): tests and the embedded agent.

Same code path as Qwen3-8B — `transformers.Qwen3ForCausalLM` — at a size that trains in minutes
on two CPU cores.
"""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def tiny_qwen3_config(
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 2048,
    pad_token_id: int = 0,
    eos_token_id: int | None = None,
    tie_word_embeddings: bool = True,
) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 3 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=hidden_size // num_attention_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        rope_theta=10000.0,
    )


def tiny_qwen3(config: Qwen3Config, seed: int = 0) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3ForCausalLM (float32, eval mode), deterministic for the seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.eval()
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    seen = {id(p): p.numel() for p in model.parameters()}
    return sum(seen.values())
