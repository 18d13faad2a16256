"""Every bad input is one line and exit code 2, and nothing is written: configs that are folders, not
UTF-8 or name a key twice; τ²-bench results of the wrong shape; damaged adapters or adapters of
another base; output paths that are the other kind, lie under a file or cannot be written."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # bad_inputs (pytest runs with --import-mode=importlib)
sys.path.insert(0, str(Path(__file__).parents[1]))  # contract_cases

from bad_inputs import corrupt_adapter, fails_with_one_line, good_adapter, other_base_adapter, unwritable
from contract_cases import capabilities_file

from tracerl.core.config_file import parse_yaml
from tracerl.core.errors import InputError

TAU2 = Path(__file__).resolve().parents[1] / "data" / "tau2" / "retail"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    good = good_adapter(root / "good")
    return {"good": good, "corrupt": corrupt_adapter(good, root / "corrupt"), "other": other_base_adapter(root / "other")}


@pytest.fixture
def files(tmp_path, monkeypatch):
    """Bad files in a folder that is also the working directory (the commands' default outputs land there)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "latin1.yaml").write_bytes("seed: 0\n# café\n".encode("latin-1"))
    (tmp_path / "twice.yaml").write_text("seed: 0\nrollout:\n  batch_size: 4\n  batch_size: 8\n")
    results = json.loads((TAU2 / "sample_results.json").read_text())
    results["simulations"][3]["reward_info"] = [1.0]
    (tmp_path / "reward_info_list.json").write_text(json.dumps(results, indent=1))
    results = json.loads((TAU2 / "sample_results.json").read_text())
    results["simulations"][0]["reward_info"]["action_checks"][0]["action"] = "cancel_pending_order"
    (tmp_path / "action_string.json").write_text(json.dumps(results, indent=1))
    return tmp_path


@pytest.mark.parametrize("config, expected", [
    ("a-folder", "a-folder: is a folder, not a config file"),
    ("latin1.yaml", "latin1.yaml:2: not a UTF-8 text file"),
    ("twice.yaml", "twice.yaml:4: not valid YAML (key 'batch_size' is given twice (lines 3 and 4))"),
])
def test_a_bad_config_file(files, capsys, config, expected):
    fails_with_one_line(["run", config, "-w", "ws"], capsys, files, expected)
    fails_with_one_line(["train", "--env", "airline", "--config", config, "--out", "out"], capsys, files, expected)


def test_duplicate_keys_are_refused_anywhere_in_a_document():
    with pytest.raises(InputError, match=r"x.yaml:3: not valid YAML \(key 'a' is given twice \(lines 2 and 3\)\)"):
        parse_yaml("top:\n  a: 1\n  a: 2\n", "x.yaml")
    with pytest.raises(InputError, match="key 'name' is given twice"):
        parse_yaml("- name: a\n  name: b\n", "x.yaml")
    assert parse_yaml("a: 1\nb: {a: 2}\n", "x.yaml") == {"a": 1, "b": {"a": 2}}  # the same key in two mappings is fine


@pytest.mark.parametrize("results, expected", [
    ("reward_info_list.json", "simulations[3]: 'reward_info' must be a JSON object, not list"),
    ("action_string.json", "simulations[0]: 'reward_info.action_checks[0].action' must be a JSON object, not str"),
])
def test_tau2_results_of_the_wrong_shape(files, capsys, results, expected):
    line = fails_with_one_line(["select", "--rollouts", results, "--out", "selection"], capsys, files, results, expected)
    assert f"{results}:" in line and line.split(":")[2].strip().isdigit()  # the simulation's line


@pytest.mark.parametrize("kind, expected", [
    ("corrupt", "cannot read the weights"),
    ("other", "does not fit the base model: 'model.layers.0.self_attn.q_proj' maps 128 → 128 features"),
])
def test_a_damaged_adapter_or_one_of_another_base(files, adapters, capsys, kind, expected):
    folder = str(adapters[kind])
    fails_with_one_line(["collect", "--policy", f"model:{folder}", "--tasks", "2", "--out", "r.jsonl"], capsys, files,
                        folder, expected)
    fails_with_one_line(["serve", "--lora", f"x={folder}", "--port", "8"], capsys, files, folder, expected)


def outputs(tmp_path: Path) -> dict[str, list[str]]:
    """Each command with a valid input, its output option last."""
    caps = capabilities_file(tmp_path / "inputs" / "capabilities.json", ["precondition_verification"])
    rollouts = str(TAU2 / "sample_results.json")
    config = tmp_path / "inputs" / "run.yaml"
    config.write_text("seed: 0\n")
    return {
        "collect": ["collect", "--policy", "oracle", "--tasks", "2", "--out"],
        "select": ["select", "--rollouts", rollouts, "--runs", "1", "--bootstrap", "0", "--out"],
        "synthesize": ["synthesize", "--capabilities", str(caps), "--target", "airline", "--no-calibrate", "--out"],
        "train": ["train", "--env", "airline", "--max-steps", "1", "--out"],
        "compose": ["compose", "--adapters", str(tmp_path), "--base", "tiny-agent", "--mode", "router", "--out"],
        "run": ["run", str(config), "-w"],
    }


FILE_OUTPUTS = {"collect"}


@pytest.mark.parametrize("command", ["collect", "select", "synthesize", "train", "compose", "run"])
@pytest.mark.parametrize("where", ["the other kind", "under a file", "unwritable"])
def test_an_output_path_that_cannot_be_written(files, capsys, command, where):
    argv = outputs(files)[command]
    if where == "the other kind":
        path = "a-folder" if command in FILE_OUTPUTS else "a-file"
        expected = "is a folder, not a file" if command in FILE_OUTPUTS else "is a file, not a folder"
    elif where == "under a file":
        path, expected = "a-file/out", "a-file is a file, so nothing can be written under it"
    else:
        folder = unwritable(files)
        path, expected = str(folder / "out"), f"cannot write in {folder}"
    fails_with_one_line(argv + [path], capsys, files, path, expected)
