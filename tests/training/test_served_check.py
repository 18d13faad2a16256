"""Served policy = trained policy: the start-up and after-swap checks against a real server (`tracerl serve`).

The same checks run against vLLM in tests/vllm; these need no vLLM and run in seconds.
"""

import math

import pytest
import torch
from training_helpers import LetterEnv, save_tiny_base

from tracerl.core.errors import InputError
from tracerl.training import checkpoint as ckpt
from tracerl.training.config import TrainConfig
from tracerl.training.run import build_trainer
from tracerl.models.served import TOLERANCE, ServedPolicyMismatch, max_difference

CFG = TrainConfig(num_generations=2, groups_per_step=1, max_steps=1, learning_rate=5e-2, eval_episodes=0,
                  rollout={"max_new_tokens": 4, "temperature": 0.7}, lora={"r": 4, "lora_alpha": 8}, seed=1)


def serve(base: str, mode: str):
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread

    model, tok = load_model(base)
    return ServerThread(LocalPolicy(model, tok, logprobs_mode=mode))


def test_max_difference_by_hand():
    local = [torch.log_softmax(torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), dim=-1)]
    exact = {2: float(local[0][2]), 1: float(local[0][1])}
    assert max_difference([exact], local) == 0.0
    # log_softmax([0,1,2]) = [-2.4076, -1.4076, -0.4076]; a server off by 0.01 on token 1
    assert max_difference([{2: -0.40760596, 1: -1.40760596 + 0.01}], local) == pytest.approx(0.01, abs=1e-7)
    assert math.isinf(max_difference([{7: -1.0}], local))  # a token outside the vocabulary


def test_unreachable_server_fails_before_any_rollout(tmp_path):
    from tracerl.serve.server import free_port

    url = f"http://127.0.0.1:{free_port('127.0.0.1')}/v1"
    with pytest.raises(InputError, match="does not answer"):
        build_trainer(CFG, save_tiny_base(tmp_path / "base"), LetterEnv, tmp_path / "out", server_url=url)


def test_raw_logprobs_server_is_refused(tmp_path):
    base = save_tiny_base(tmp_path / "base")
    with serve(base, "raw_logprobs") as server:
        with pytest.raises(InputError, match="raw log-probs.*--logprobs-mode processed_logprobs"):
            build_trainer(CFG, base, LetterEnv, tmp_path / "out", server_url=server.base_url)


def test_a_server_with_another_model_is_refused(tmp_path):
    from training_helpers import tiny_model, tiny_tokenizer

    base = save_tiny_base(tmp_path / "base")
    other = tmp_path / "other"
    tok = tiny_tokenizer()
    tiny_model(len(tok), seed=7).save_pretrained(other)
    tok.save_pretrained(other)
    with serve(str(other), "processed_logprobs") as server:
        with pytest.raises(InputError, match="is not the trainer's base"):
            build_trainer(CFG, base, LetterEnv, tmp_path / "out", server_url=server.base_url)


def test_each_swap_is_checked_and_a_skipped_swap_stops_training(tmp_path):
    base = save_tiny_base(tmp_path / "base")
    with serve(base, "processed_logprobs") as server:
        trainer = build_trainer(CFG, base, LetterEnv, tmp_path / "out", server_url=server.base_url)
        backend, model = trainer.backend, trainer.model
        ckpt.save_adapter(model, trainer.out)
        backend.after_step(trainer.out)
        assert max(backend.check.last_difference) <= TOLERANCE
        torch.manual_seed(0)

        def step_like_update():
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "lora_" in name:
                        p.add_(5e-2 * torch.randn_like(p))
            ckpt.save_adapter(model, trainer.out)

        step_like_update()
        backend.after_step(trainer.out)
        assert max(backend.check.last_difference) <= TOLERANCE
        assert [p.name[:5] for p in (tmp_path / "out" / "served_adapters").iterdir()] == ["00001"]  # a fresh copy per swap
        step_like_update()
        backend.control.swap_adapter = lambda *a, **k: None  # the swap is skipped
        with pytest.raises(ServedPolicyMismatch, match="not the trained one"):
            backend.after_step(trainer.out)
        assert max(backend.check.last_difference) > 10 * TOLERANCE


def test_a_bfloat16_server_and_trainer_pass_and_a_wrong_adapter_fails(tmp_path):
    """`model.dtype: bfloat16` on both sides: the tolerance is bfloat16's, the served adapter passes it (measured
    0.008 nats), and a server left on the adapter before a large update (a wrong adapter: 0.49) is refused."""
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread
    from tracerl.models.served import TOLERANCES

    base = save_tiny_base(tmp_path / "base")
    model, tok = load_model(base, dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    with ServerThread(LocalPolicy(model, tok, logprobs_mode="processed_logprobs")) as server:
        trainer = build_trainer(CFG, base, LetterEnv, tmp_path / "out", server_url=server.base_url, dtype="bfloat16")
        backend, peft_model = trainer.backend, trainer.model
        assert trainer.run_info["dtype"] == "bfloat16" and backend.check.tolerance == TOLERANCES["bfloat16"]
        torch.manual_seed(0)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_" in name:
                    p.add_(0.3 * torch.randn_like(p))
        ckpt.save_adapter(peft_model, trainer.out)
        backend.after_step(trainer.out)
        assert max(backend.check.last_difference) <= TOLERANCES["bfloat16"]
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.add_(0.3 * torch.randn_like(p))
        ckpt.save_adapter(peft_model, trainer.out)
        backend.control.swap_adapter = lambda *a, **k: None  # the server keeps the adapter before the update
        with pytest.raises(ServedPolicyMismatch, match="not the trained one"):
            backend.after_step(trainer.out)
        assert max(backend.check.last_difference) > TOLERANCES["bfloat16"]
