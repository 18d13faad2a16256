import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).parent))  # training_helpers (pytest runs with --import-mode=importlib)


def tiny_qwen3(vocab_size: int = 64, seed: int = 0) -> Qwen3ForCausalLM:
    """A real Qwen3-architecture model with random weights, small enough for CI."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                      tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg)


@pytest.fixture
def tiny_model():
    return tiny_qwen3().eval()
