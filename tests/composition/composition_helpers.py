"""Tiny random-weight Qwen3 models and PEFT LoRA adapters (random non-zero B) for the composition tests."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen3Config, Qwen3ForCausalLM

ALL_PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_config(hidden: int = 32, layers: int = 2, vocab: int = 64) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=256,
        tie_word_embeddings=False,
    )


def tiny_model(seed: int = 0, **kwargs) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_config(**kwargs)).eval()
    return model


def make_adapter(base: Qwen3ForCausalLM, out: Path, *, seed: int, r: int = 4, alpha: float = 8.0,
                 targets: list[str] | None = None, base_name: str | None = None, scale: float = 0.3, **lora_kwargs) -> Path:
    """Save a PEFT LoRA adapter of a copy of `base` with random non-zero A and B to `out`."""
    model = copy.deepcopy(base)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets or ALL_PROJ, lora_dropout=0.0, **lora_kwargs)
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * scale)
    peft_model.save_pretrained(str(out))
    if base_name is not None:  # as if trained on that base (set after saving: PEFT would look the name up)
        config_path = out / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = base_name
        config_path.write_text(json.dumps(config))
    return out


def save_base(model: Qwen3ForCausalLM, tokenizer, out: Path) -> Path:
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def toy_tokenizer():
    """A small byte-level BPE tokenizer with the tiny agent's ChatML template (built, not downloaded)."""
    from tracerl.models.tokenizer import train_tokenizer

    texts = ["cancel my reservation please", "look up the order status", "which specialist should handle this"] * 20
    return train_tokenizer(texts, vocab_size=300)


def two_adapters(tmp_path_factory):
    """(base, toy tokenizer, [alpha dir, beta dir]): a tiny base and two adapters of different ranks and targets."""
    tokenizer = toy_tokenizer()
    base = tiny_model(seed=0, vocab=len(tokenizer))
    root = tmp_path_factory.mktemp("adapters")
    dirs = [make_adapter(base, root / "alpha", seed=1),
            make_adapter(base, root / "beta", seed=2, r=2, alpha=3.0, targets=["q_proj", "down_proj"])]
    return base, tokenizer, dirs
