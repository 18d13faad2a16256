"""Small real parts for trainer tests: a two-turn environment with hints, a tiny tokenizer and model."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from tracerl.core.messages import Message
from tracerl.envs.base import Env, StepResult
from tracerl.models.tokenizer import train_tokenizer

LETTERS = "abcdefgh"


def tiny_qwen3(vocab_size: int = 64, seed: int = 0) -> Qwen3ForCausalLM:
    """A real Qwen3-architecture model with random weights, small enough for CI."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                      tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg)


class LetterEnv(Env):
    """Two assistant turns; reward = share of the letter the task asks for among the reply characters.

    The hint (options={'hint': True}) appends "Hint: …" to the user turn; `_prompt_without_hint`
    holds the opening messages without it.
    """

    name = "letters"
    max_turns = 2

    @property
    def tools(self):
        return []

    def reset(self, seed=None, options=None) -> tuple[list[Message], dict[str, Any]]:
        self.letter = LETTERS[(seed or 0) % len(LETTERS)]
        self.replies: list[str] = []
        plain = [Message.system("Write letters."), Message.user(f"Write the letter {self.letter}.")]
        info: dict[str, Any] = {"task_id": f"letter-{seed}", "_prompt_without_hint": plain}
        if (options or {}).get("hint"):
            return [plain[0], Message.user(plain[1].content + f" Hint: {self.letter * 3}")], info
        return list(plain), info

    def step(self, message: Message) -> StepResult:
        self.replies.append(message.content or "")
        if len(self.replies) < 2:
            return [Message.user("Again.")], 0.0, False, False, {}
        text = "".join(self.replies)
        reward = min(1.0, 4 * text.count(self.letter) / max(len(text), 1))
        return [], reward, True, False, {"termination": "user_stop", "reward_breakdown": {}}


def tiny_tokenizer():
    corpus = [f"Write the letter {c}. Hint: {c * 3} Again. Write letters." for c in LETTERS] * 4
    return train_tokenizer(corpus, vocab_size=300)


def tiny_model(vocab_size: int, seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg)


def save_tiny_base(directory) -> str:
    """A tiny Qwen3 + tokenizer saved as a Hugging Face model directory (what --base takes)."""
    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)


def tiny_moe_model(vocab_size: int, seed: int = 0):
    """A real Qwen3-MoE (transformers 5: fused expert weights) with random weights, 4 experts, 2 per token."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         num_experts=4, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=True)
    return Qwen3MoeForCausalLM(cfg)


def save_tiny_moe_base(directory) -> str:
    """The tiny Qwen3-MoE + tokenizer saved as a Hugging Face model directory."""
    tok = tiny_tokenizer()
    model = tiny_moe_model(len(tok))
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)
