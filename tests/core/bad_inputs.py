"""Real bad inputs for the CLI tests: adapter folders (a good one, damaged ones, one of another base), a
folder nothing can be written in, and the check that a failed command said one line and wrote nothing."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen3Config, Qwen3ForCausalLM

from tracerl.cli import main
from tracerl.models.local import load_model


def good_adapter(path: Path) -> Path:
    """A real LoRA adapter of the embedded tiny agent (its factors nonzero)."""
    model, _ = load_model("tiny-agent", device="cpu")
    torch.manual_seed(0)
    peft = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    peft.save_pretrained(str(path), save_embedding_layers=False)
    return path


def other_base_adapter(path: Path) -> Path:
    """A real LoRA adapter of a narrower Qwen3 that names the tiny agent as its base."""
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=True)
    peft = get_peft_model(Qwen3ForCausalLM(cfg), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    peft.save_pretrained(str(path), save_embedding_layers=False)
    config = path / "adapter_config.json"
    config.write_text(config.read_text().replace('"base_model_name_or_path": null', '"base_model_name_or_path": "tiny-agent"'))
    return path


def corrupt_adapter(good: Path, path: Path) -> Path:
    """`good` with its weights file cut in half."""
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_bytes((good / "adapter_config.json").read_bytes())
    weights = (good / "adapter_model.safetensors").read_bytes()
    (path / "adapter_model.safetensors").write_bytes(weights[: len(weights) // 2])
    return path


def unwritable(tmp_path: Path) -> Path:
    """A folder in which nothing can be created: a read-only one, or (root ignores modes) sysfs."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o500)
        return folder
    return Path("/sys")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def fails_with_one_line(argv: list[str], capsys, root: Path, *expected: str) -> str:
    """Run the CLI: exit code 2, one line on stderr naming `expected`, nothing written under `root`."""
    before = snapshot(root)
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, (argv, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)
    for text in expected:
        assert text in lines[0], (argv, lines[0], text)
    assert snapshot(root) == before, f"{argv} wrote files"
    return lines[0]
