"""Training memory: token log-probs over chunks of the output head (no whole-vocabulary distribution), the
entropy only where it is logged, activation checkpointing, micro-batches by a token budget — each giving
the gradients of the plain computation."""

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch.utils._python_dispatch import TorchDispatchMode
from training_helpers import LetterEnv, save_tiny_base

from tracerl.core.errors import InputError
from tracerl.training.config import TrainConfig
from tracerl.training.distributed import World
from tracerl.training.loss import BatchCounts, policy_loss, token_logprobs
from tracerl.training.run import build_trainer
from tracerl.training.sequences import TrainSequence, collate, micro_batches


@pytest.fixture
def lora_model(tiny_model):
    torch.manual_seed(1)
    model = get_peft_model(tiny_model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # a non-zero adapter: LoRA gradients flow everywhere
    return model


class LargestVocabularyRows(TorchDispatchMode):
    """Records the most rows (elements / vocabulary) of any tensor an op produces whose last dimension is the
    vocabulary, views of the model's weights aside: how much of the [tokens, vocabulary] distribution
    existed at once."""

    def __init__(self, vocab: int, model: torch.nn.Module):
        super().__init__()
        self.vocab, self.rows = vocab, 0
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] == self.vocab \
                    and t.untyped_storage().data_ptr() not in self.weights:
                self.rows = max(self.rows, t.numel() // self.vocab)
        return out


def grads_of(model, ids, mask, prefix, chunk, entropy=True):
    model.zero_grad()
    logp, ent = token_logprobs(model, ids, mask, 0.8, prefix_len=prefix, chunk_elements=chunk, entropy=entropy)
    weights = torch.randn(logp.shape, generator=torch.Generator().manual_seed(3))
    (logp * weights).sum().backward()
    return logp.detach(), ent, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("prefix", [0, 5])
def test_chunked_head_gives_the_same_logprobs_entropy_and_gradients(lora_model, prefix):
    ids = torch.randint(0, 64, (3, 12), generator=torch.Generator().manual_seed(0))
    ids[:, :prefix] = ids[0, :prefix]  # the rows share their prompt
    mask = torch.ones_like(ids)
    whole = grads_of(lora_model, ids, mask, prefix, chunk=1 << 27)
    chunked = grads_of(lora_model, ids, mask, prefix, chunk=64 * 4)  # 4 tokens per chunk
    for a, b in zip(whole, chunked):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
    assert whole[2].abs().sum() > 0


def test_no_more_than_a_chunk_of_the_distribution_exists():
    """Forward and backward: a [tokens, vocabulary] tensor of at most one chunk's tokens, where whole logits
    hold every token's (a vocabulary of 101, a size no other dimension has)."""
    from training_helpers import tiny_qwen3

    model = get_peft_model(tiny_qwen3(vocab_size=101), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    ids = torch.randint(0, 101, (4, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    for chunk_tokens, expect in ((5, 5), (10_000, 4 * 16)):
        with LargestVocabularyRows(101, model) as seen:
            grads_of(model, ids, mask, 0, chunk=101 * chunk_tokens)
        assert seen.rows == expect


def test_entropy_only_where_asked(lora_model):
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    logp, ent = token_logprobs(lora_model, ids, torch.ones_like(ids), entropy=False)
    assert ent is None
    same, with_entropy = token_logprobs(lora_model, ids, torch.ones_like(ids))
    assert torch.equal(logp, same) and (with_entropy[:, 1:] > 0).all()
    # the entropy by hand at one position: −Σ p log p of that position's distribution
    with torch.no_grad():
        probs = torch.softmax(lora_model(input_ids=ids).logits[0, 2].float(), -1)
    assert with_entropy[0, 3].item() == pytest.approx(-(probs * probs.log()).sum().item(), abs=1e-5)


def test_micro_batches_by_tokens_by_hand():
    seqs = [TrainSequence([0] * n, [0.0] * n, [1] * n, 1.0) for n in (10, 12, 30, 5, 5, 5)]
    cut = [[len(s.ids) for s in part] for part in micro_batches(seqs, 16, max_tokens=40)]
    # 10, 12: 2 × 12 = 24 fit; + 30: 3 × 30 = 90 do not; 30 alone; 30 + 5: 2 × 30 = 60 do not; 5, 5, 5: 15
    assert cut == [[10, 12], [30], [5, 5, 5]]
    assert [[len(s.ids) for s in part] for part in micro_batches(seqs, 2)] == [[10, 12], [30, 5], [5, 5]]
    assert [[len(s.ids) for s in part] for part in micro_batches(seqs, 16, max_tokens=8)] == [[10], [12], [30], [5], [5], [5]]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("base"))


CFG = TrainConfig(num_generations=4, groups_per_step=2, max_steps=1, learning_rate=1e-2, eval_episodes=0,
                  rollout={"max_new_tokens": 8, "temperature": 1.0}, lora={"r": 4, "lora_alpha": 8}, seed=4,
                  num_iterations=1, beta=0.04)


def one_update(base, out, **changes):
    """One update on the same sampled batch, with `changes` to the memory settings; the adapter's gradient."""
    trainer = build_trainer(CFG.model_copy(update=changes), base, LetterEnv, out)
    sample = trainer.sample_step(1)
    from tracerl.training.advantages import group_advantages, informative_groups
    from tracerl.training.sequences import training_sequence

    rewards = torch.tensor([[t.reward for t in g] for g in sample.groups], dtype=torch.float64)
    adv, keep = group_advantages(rewards), informative_groups(rewards)
    seqs = [training_sequence(t, float(adv[g, i]), trainer._hint_free_prompt(t), trainer.render_prompt)
            for g in range(len(sample.groups)) if keep[g] for i, t in enumerate(sample.groups[g])]
    assert seqs, "no informative group"
    row = trainer.update(copy.deepcopy(seqs))
    return row, torch.cat([p.grad.flatten() for p in trainer.params]), max(len(s.ids) for s in seqs)


def test_checkpointing_and_token_budget_give_the_same_update(base, tmp_path):
    plain, grad, longest = one_update(base, tmp_path / "plain")
    for changes in ({"gradient_checkpointing": True}, {"per_device_train_batch_tokens": longest},
                    {"gradient_checkpointing": True, "per_device_train_batch_tokens": 2 * longest}):
        row, other, _ = one_update(base, tmp_path / "other", **changes)
        assert torch.allclose(grad, other, rtol=1e-4, atol=1e-7), (changes, (grad - other).abs().max())
        assert row["loss"] == pytest.approx(plain["loss"], rel=1e-5, abs=1e-7)
        assert row["entropy"] == pytest.approx(plain["entropy"], rel=1e-5)
    assert grad.abs().sum() > 0


def test_fsdp2_refuses_rollouts_in_the_trainer(base, tmp_path):
    """Sharded over 2 ranks, in-process sampling would gather the whole model on every GPU: refused before
    anything loads (no process group is needed to say so)."""
    with pytest.raises(InputError, match="shard: fsdp2 samples its rollouts on servers.*model.server_url"):
        build_trainer(CFG.model_copy(update={"shard": "fsdp2"}), base, LetterEnv, tmp_path / "out", world=World(0, 2))
