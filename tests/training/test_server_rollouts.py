"""Rollouts from an OpenAI-compatible server (`tracerl serve`, vLLM's API) with the adapter hot-swapped each step."""

import pytest
import torch
from safetensors.torch import load_file
from training_helpers import LetterEnv, save_tiny_base

from tracerl.training.config import TrainConfig
from tracerl.training.run import build_trainer


@pytest.mark.slow
def test_server_rollouts_with_hot_swapped_adapter(tmp_path):
    from peft.utils import get_peft_model_state_dict

    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread

    torch.set_num_threads(1)
    base = save_tiny_base(tmp_path / "base")
    model, tok = load_model(base)
    served = LocalPolicy(model, tok, logprobs_mode="processed_logprobs")
    cfg = TrainConfig(num_generations=4, groups_per_step=2, max_steps=2, learning_rate=5e-2, rollout={"max_new_tokens": 6},
                      eval_episodes=2, eval_steps=2, hint_fraction=0.5, lora={"r": 4, "lora_alpha": 8}, seed=2)
    with ServerThread(served) as server:
        trainer = build_trainer(cfg, base, LetterEnv, tmp_path / "out", server_url=server.base_url,
                                served_model="letters")
        rows = trainer.train()
        assert trainer.backend.swaps == 1 + 2  # the initial adapter, then after each step
        on_server = get_peft_model_state_dict(served.model, adapter_name="letters")
    trained = [r for r in rows if r.get("loss") is not None]
    assert trained, "no informative group"
    for r in trained:
        # the server sampled with the adapter of the previous step: the first-pass ratio is 1
        # (up to the float noise of batched vs unbatched kernels)
        assert r["approx_kl"] < 1e-5 and r["clip_ratio"] == 0.0
    saved = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    assert saved.keys() == on_server.keys()
    assert all(torch.allclose(saved[k], on_server[k]) for k in saved)
    assert any(v.abs().sum() > 0 for k, v in on_server.items() if "lora_B" in k)  # not the untrained adapter
