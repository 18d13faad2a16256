"""A seeded fuzz test of every kind of file a user hands tracerl: run and training configs, rollouts files,
τ²-bench results, capabilities files and adapter folders. Each valid file is mutated (bytes cut, flipped,
inserted; lines dropped, doubled — a YAML key given twice —, swapped; a value replaced by one of another
type, an empty one, a huge one or one nested thousands deep) and handed to the command (or, for adapters,
the loader `collect --policy model:DIR`, `serve --lora` and /v1/load_lora_adapter share). Whatever the
mutation, the outcome is success or one line naming the file and exit code 2 (an `InputError`) — never a
traceback — and nothing is written. Each kind stops after `CASES` mutations or `SECONDS`, whichever first."""

import json
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))  # bad_inputs (pytest runs with --import-mode=importlib)
sys.path.insert(0, str(Path(__file__).parents[1]))  # contract_cases

from bad_inputs import good_adapter, snapshot
from contract_cases import capabilities_file

from tracerl.cli import main
from tracerl.core.errors import InputError
from tracerl.core.io import write_jsonl
from tracerl.envs.loading import load_rollouts
from tracerl.models.local import LocalPolicy, load_model

SEED = 67
CASES = 60
SECONDS = 25.0
TAU2 = Path(__file__).resolve().parents[1] / "data" / "tau2" / "retail"
DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
ODD_VALUES: list[Any] = [None, 0, -1, 1e308, 2**70, "", "x" * 5000, "🙂\u0000", [], {}, True, [1, "a", None],
                         {"nested": {"deeper": [None]}}]


def odd_value(rng: random.Random) -> Any:
    if rng.random() < 0.1:
        depth = rng.choice([50, 5000])
        return json.loads("[" * depth + "]" * depth) if depth < 900 else {"deep": "DEEP-NESTING"}
    return rng.choice(ODD_VALUES)


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a JSON-like structure."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:20]):
            out += paths(v, prefix + (i,))
    return out


def replace_at(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replace_at(value[path[0]], path[1:], new)
    return copy


def mutate_structure(data: Any, rng: random.Random) -> Any:
    path = rng.choice(paths(data))
    return replace_at(data, path, odd_value(rng))


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    lines = data.split(b"\n")
    op = rng.randrange(7)
    if op == 0:  # cut
        return data[: rng.randrange(len(data))]
    if op == 1:  # flip bytes
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out)
    if op == 2:  # insert bytes (not always UTF-8)
        at = rng.randrange(len(data))
        return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 6))) + data[at:]
    if op == 3:  # drop a line
        del lines[rng.randrange(len(lines))]
    elif op == 4:  # double a line (in YAML: a key given twice)
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
    elif op == 5:  # swap two lines
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    else:  # nest a line very deep
        i = rng.randrange(len(lines))
        lines[i] = b"[" * 20000 + lines[i]
    return b"\n".join(lines)


def mutations(valid: bytes, rng: random.Random, parse, dump) -> list[bytes]:
    """CASES mutations of `valid`: half at the byte level, half of its parsed structure (`parse`, `dump`)."""
    data = parse(valid)
    out = []
    for k in range(CASES):
        if k % 2:
            out.append(mutate_bytes(valid, rng))
        else:
            mutated = mutate_structure(data, rng)
            text = dump(mutated)
            out.append(text.replace('"DEEP-NESTING"', "[" * 5000 + "]" * 5000).encode())
    return out


class Fuzz:
    """Runs one kind's mutations; collects every outcome that breaks the rules."""

    def __init__(self, tmp_path: Path, name: str):
        self.root = tmp_path
        self.file = tmp_path / name
        self.problems: list[str] = []
        self.outcomes = {"ok": 0, "refused": 0}
        self.deadline = time.monotonic() + SECONDS

    def run(self, cases: list[bytes], argv: list[str], capsys, *, guarded: set[str] = frozenset()) -> None:
        for k, data in enumerate(cases):
            if time.monotonic() > self.deadline:
                break
            self.file.write_bytes(data)
            before = snapshot(self.root)
            try:
                code = main(argv)
            except BaseException as e:  # noqa: BLE001 — a traceback is the failure this test looks for
                self.problems.append(f"case {k}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")
                capsys.readouterr()
                continue
            err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
            if code == 0:
                self.outcomes["ok"] += 1
            elif code != 2:
                self.problems.append(f"case {k}: exit {code}: {err[-3:]}")
            elif len(err) != 1 or not err[0].startswith("error: "):
                self.problems.append(f"case {k}: not one line: {err[:3]}")
            elif str(self.file.name) not in err[0] and not any(g in err[0] for g in guarded):
                self.problems.append(f"case {k}: the line does not name the file: {err[0]}")
            else:
                self.outcomes["refused"] += 1
            if snapshot(self.root) != before:
                self.problems.append(f"case {k}: files were written")

    def check(self) -> None:
        assert self.problems == [], "\n".join(self.problems[:5])
        assert self.outcomes["refused"] > 0  # the mutations do reach the readers


def yaml_dump(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True)


@pytest.fixture
def ws(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x")  # outputs under it fail: a valid input stops there, having been read
    return tmp_path


def test_fuzz_run_configs(ws, capsys):
    fuzz = Fuzz(ws, "run.yaml")
    cases = mutations(DEMO.read_bytes(), random.Random(SEED), yaml.safe_load, yaml_dump)
    fuzz.run(cases, ["run", "run.yaml", "-w", "a-file/ws"], capsys, guarded={"a-file/ws"})
    fuzz.check()


def test_fuzz_training_configs(ws, capsys):
    fuzz = Fuzz(ws, "train.yaml")
    valid = yaml_dump({"num_generations": 4, "learning_rate": 0.002, "lora": {"r": 4, "lora_alpha": 8},
                       "rollout": {"max_new_tokens": 16}}).encode()
    cases = mutations(valid, random.Random(SEED + 1), yaml.safe_load, yaml_dump)
    fuzz.run(cases, ["train", "--env", "airline", "--config", "train.yaml", "--out", "a-file/out"], capsys,
             guarded={"a-file/out"})
    fuzz.check()


def test_fuzz_rollouts_files(ws, capsys):
    fuzz = Fuzz(ws, "rollouts.jsonl")
    write_jsonl(ws / "valid.jsonl", load_rollouts(TAU2 / "sample_results.json")[:6])
    valid = (ws / "valid.jsonl").read_bytes()
    (ws / "valid.jsonl").unlink()

    def parse(data: bytes) -> list:
        return [json.loads(line) for line in data.decode().splitlines()]

    def dump(records: list) -> str:
        return "\n".join(json.dumps(r) for r in records) + "\n"

    cases = mutations(valid, random.Random(SEED + 2), parse, dump)
    fuzz.run(cases, ["show", "rollouts.jsonl", "--json"], capsys)
    fuzz.check()


def test_fuzz_tau2_results(ws, capsys):
    fuzz = Fuzz(ws, "results.json")
    doc = json.loads((TAU2 / "sample_results.json").read_text())
    doc["simulations"] = doc["simulations"][:4]
    valid = json.dumps(doc, indent=1).encode()
    cases = mutations(valid, random.Random(SEED + 3), json.loads, lambda d: json.dumps(d, indent=1))
    fuzz.run(cases, ["show", "results.json", "--json"], capsys)
    fuzz.run(cases[:10], ["select", "--rollouts", "results.json", "--out", "a-file/sel"], capsys, guarded={"a-file/sel"})
    fuzz.check()


def test_fuzz_capabilities_files(ws, capsys):
    fuzz = Fuzz(ws, "capabilities.json")
    valid = capabilities_file(ws / "valid.json", ["precondition_verification"], ["tone"],
                              examples={"precondition_verification": [("7", "wrote first")]}).read_bytes()
    (ws / "valid.json").unlink()
    cases = mutations(valid, random.Random(SEED + 4), json.loads, lambda d: json.dumps(d, indent=1))
    fuzz.run(cases, ["synthesize", "--capabilities", "capabilities.json", "--target", "airline", "--no-calibrate",
                     "--out", "a-file/envs"], capsys, guarded={"a-file/envs"})
    fuzz.check()


def test_fuzz_adapter_folders(tmp_path):
    """Adapter folders: damaged config or weights are refused by the loader, naming the folder or file, and leave
    nothing registered; what stays loadable loads."""
    good = good_adapter(tmp_path / "good")
    config, weights = (good / "adapter_config.json").read_bytes(), (good / "adapter_model.safetensors").read_bytes()
    model, tokenizer = load_model("tiny-agent", device="cpu")
    original = {k: v.clone() for k, v in model.state_dict().items()}
    policy = LocalPolicy(model, tokenizer, max_new_tokens=4)
    rng = random.Random(SEED + 5)
    problems, outcomes = [], {"ok": 0, "refused": 0}
    deadline = time.monotonic() + SECONDS
    for k in range(CASES):
        if time.monotonic() > deadline:
            break
        folder = tmp_path / f"case-{k}"
        folder.mkdir()
        mutated_config, mutated_weights = config, weights
        which = rng.randrange(3)
        if which == 0:
            mutated_config = mutations(config, rng, json.loads, json.dumps)[rng.randrange(CASES)]
        elif which == 1:
            mutated_weights = mutate_bytes(weights, rng) if rng.random() < 0.5 else weights[: rng.randrange(len(weights))]
        else:
            header = int.from_bytes(weights[:8], "little")
            at = 8 + rng.randrange(header)  # inside the header: names, dtypes, shapes, offsets
            mutated_weights = weights[:at] + bytes([rng.randrange(32, 127)]) + weights[at + 1:]
        (folder / "adapter_config.json").write_bytes(mutated_config)
        (folder / "adapter_model.safetensors").write_bytes(mutated_weights)
        before = list(policy.adapters)
        try:
            policy.load_adapter("fuzz", folder)
            outcomes["ok"] += 1
            policy.unload_adapter("fuzz")
        except InputError as e:
            outcomes["refused"] += 1
            if str(folder) not in str(e) or "\n" in str(e):
                problems.append(f"case {k}: {e}")
            if list(policy.adapters) != before:
                problems.append(f"case {k}: a failed load left {policy.adapters}")
        except BaseException as e:  # noqa: BLE001
            problems.append(f"case {k} ({which}): {type(e).__name__}: {str(e)[:300]}")
    assert problems == [], "\n".join(problems[:5])
    assert outcomes["refused"] > 0
    # the base model is the one it was: nothing a failed load injected stays
    state = policy.model.state_dict()
    assert state.keys() == original.keys() and all(torch.equal(state[k], original[k]) for k in state)
