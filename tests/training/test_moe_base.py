"""A mixture-of-experts base (a tiny random Qwen3-MoE, transformers 5: fused expert weights) through training,
serving with hot-swapped adapters, and composition with gates.

The default LoRA targets (all seven projections) adapt its attention and, for gate_proj/up_proj/down_proj,
which it lacks as modules, its fused expert weights (PEFT's target_parameters, one LoRA per expert).
"""

import copy

import pytest
import torch
from training_helpers import LetterEnv, save_tiny_moe_base

from tracerl.core.errors import InputError
from tracerl.training.config import TrainConfig
from tracerl.training.run import build_trainer
from tracerl.models.served import ServedPolicyMismatch

CFG = TrainConfig(num_generations=4, groups_per_step=2, max_steps=1, learning_rate=5e-2, eval_episodes=0,
                  rollout={"max_new_tokens": 6, "temperature": 1.0}, lora={"r": 4, "lora_alpha": 8}, seed=2)
EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


@pytest.fixture(scope="module")
def moe_base(tmp_path_factory):
    return save_tiny_moe_base(tmp_path_factory.mktemp("moe_base"))


def expert_lora(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n and ".experts." in n}


def test_default_targets_adapt_attention_and_every_experts_weights(moe_base, tmp_path):
    trainer = build_trainer(CFG, moe_base, LetterEnv, tmp_path / "out")
    config = trainer.model.peft_config["default"]
    assert sorted(config.target_modules) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert sorted(config.target_parameters) == sorted(EXPERTS)
    before = expert_lora(trainer.model)
    assert len(before) == 2 * 2 * 2  # 2 layers × 2 fused weights × (A, B)
    # one LoRA per expert: A is (r · experts) × in
    assert all(p.shape[0] == 4 * 4 for n, p in before.items() if "lora_A" in n)
    rows = trainer.train()
    assert rows[-1]["trained_sequences"] > 0 and rows[-1]["grad_norm"] > 0
    after = expert_lora(trainer.model)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora_B" in n)  # the experts' adapters trained
    # the saved adapter is PEFT's: it loads onto the base and gives the trained model's outputs
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(moe_base), str(tmp_path / "out")).eval()
    ids = torch.tensor([[5, 9, 13, 2, 7]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, trainer.model.eval()(ids).logits, atol=1e-5)


def test_targets_the_base_lacks_are_refused(moe_base, tmp_path):
    with pytest.raises(InputError, match="target_parameters not in the base model: mlp.shared_expert.up_proj"):
        build_trainer(CFG.model_copy(update={"lora": CFG.lora.model_copy(update={"target_parameters": ["mlp.shared_expert.up_proj"]})}),
                      moe_base, LetterEnv, tmp_path / "out")
    # [] leaves the experts without an adapter: attention only
    trainer = build_trainer(CFG.model_copy(update={"lora": CFG.lora.model_copy(update={"target_parameters": []})}),
                            moe_base, LetterEnv, tmp_path / "attention")
    assert not expert_lora(trainer.model)


def test_served_expert_adapters_are_hot_swapped_and_checked(moe_base, tmp_path):
    """Rollouts from `tracerl serve` holding the MoE base: the adapter (experts included) is swapped in after
    the step and its log-probs equal the trainer's; a skipped swap is caught."""
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread
    from tracerl.training import checkpoint as ckpt

    model, tok = load_model(moe_base)
    with ServerThread(LocalPolicy(model, tok, logprobs_mode="processed_logprobs")) as server:
        trainer = build_trainer(CFG, moe_base, LetterEnv, tmp_path / "out", server_url=server.base_url)
        trainer.train()
        assert trainer.backend.swaps == 2  # the initial adapter, then after the step
        assert max(trainer.backend.check.last_difference) < 1e-4
        with torch.no_grad():
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name and ".experts." in name:
                    p.add_(0.5)  # only the experts' adapters move
        ckpt.save_adapter(trainer.model, trainer.out)
        trainer.backend.control.swap_adapter = lambda *a, **k: None  # the swap is skipped
        with pytest.raises(ServedPolicyMismatch, match="not the trained one"):
            trainer.backend.after_step(trainer.out)


def test_composed_gates_on_expert_adapters(moe_base, tmp_path):
    """Two adapters (attention and experts) composed: a slot forced equals the PEFT model with that adapter,
    the unrouted model is the base, per-token routing mixes them, and the composed directory serves."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from tracerl.models.composed.adapters import load_adapter
    from tracerl.models.composed.artifact import load_composed, save_composed, spec_for
    from tracerl.models.composed.composition import compose
    from tracerl.models.composed.experts import GatedLoRAExperts

    base = AutoModelForCausalLM.from_pretrained(moe_base).eval()
    dirs = []
    for seed in (1, 2):
        peft = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                              target_parameters=list(EXPERTS)))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
        peft.save_pretrained(str(tmp_path / f"cap_{seed}"))
        dirs.append(tmp_path / f"cap_{seed}")
    model = copy.deepcopy(base)
    composition = compose(model, [load_adapter(d) for d in dirs], base_ref=moe_base)
    assert sum(isinstance(m, GatedLoRAExperts) for layer in composition.linears for m in layer) == 2
    ids = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        outputs = {}
        for slot, d in enumerate(dirs, start=1):
            expected = PeftModel.from_pretrained(copy.deepcopy(base), str(d)).eval()(ids).logits
            with composition.routing(force_slots=slot):
                outputs[slot] = model(ids).logits
            assert (expected - base(ids).logits).abs().max() > 1e-2
            assert torch.allclose(outputs[slot], expected, atol=1e-5)
        assert torch.equal(model(ids).logits, base(ids).logits)  # unrouted: the base
        # tokens 0..4 on slot 1, the rest on slot 2: the first five positions are slot 1's (causal attention)
        slots = torch.tensor([[1] * 5 + [2] * 4] * 2)
        with composition.routing(force_slots=slots):
            mixed = model(ids).logits
        assert torch.allclose(mixed[:, :5], outputs[1][:, :5], atol=1e-5)
        assert not torch.allclose(mixed[:, 5:], outputs[1][:, 5:], atol=1e-3)
    # the composed directory loads and routes its gates (untrained: every token on the base)
    out = tmp_path / "composed"
    save_composed(composition, spec_for(composition, moe_base, out, dtype="float32"), out)
    loaded = load_composed(out)
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, base(ids).logits, atol=1e-6)
