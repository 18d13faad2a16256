"""Bad input gives one clear InputError: mismatched bases, ranks, shapes, targets, capability lists."""

from __future__ import annotations

import copy
import json

import pytest
from composition_helpers import make_adapter, tiny_model
from contract_cases import capabilities_file
from safetensors.torch import load_file, save_file

from tracerl.models.composed.adapters import load_adapter
from tracerl.composition.build import capabilities_for
from tracerl.models.composed.composition import compose
from tracerl.contracts import Capability
from tracerl.core.errors import InputError


@pytest.fixture(scope="module")
def base():
    return tiny_model(seed=0)


def test_adapters_of_different_bases(base, tmp_path):
    a = make_adapter(base, tmp_path / "a", seed=1, base_name="org/model-one")
    b = make_adapter(base, tmp_path / "b", seed=2, base_name="org/model-two")
    assert json.loads((a / "adapter_config.json").read_text())["base_model_name_or_path"] == "org/model-one"
    with pytest.raises(InputError, match="adapters of different bases"):
        compose(copy.deepcopy(base), [load_adapter(a), load_adapter(b)])
    with pytest.raises(InputError, match="not on the base 'org/model-two'"):
        compose(copy.deepcopy(base), [load_adapter(a)], base_ref="org/model-two")


def test_adapter_shapes_that_do_not_fit_the_base(base, tmp_path):
    bigger = tiny_model(seed=0, hidden=48)
    path = make_adapter(bigger, tmp_path / "big", seed=1)
    with pytest.raises(InputError, match=r"LoRA maps 96 → 48 but the base layer maps 64 → 32"):
        compose(copy.deepcopy(base), [load_adapter(path)])


def test_rank_in_config_does_not_match_the_weights(base, tmp_path):
    path = make_adapter(base, tmp_path / "a", seed=1, r=4)
    config = json.loads((path / "adapter_config.json").read_text())
    config["r"] = 8
    (path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="do not have rank r=8"):
        load_adapter(path)


def test_target_the_base_lacks(base, tmp_path):
    path = make_adapter(base, tmp_path / "a", seed=1, targets=["q_proj"])
    state = load_file(str(path / "adapter_model.safetensors"))
    renamed = {k.replace("layers.1.", "layers.7."): v for k, v in state.items()}
    save_file(renamed, str(path / "adapter_model.safetensors"))
    with pytest.raises(InputError, match="targets model.layers.7.self_attn.q_proj, which the base model lacks"):
        compose(copy.deepcopy(base), [load_adapter(path)])


def test_unsupported_lora_variants_and_missing_files(base, tmp_path):
    path = make_adapter(base, tmp_path / "dora", seed=1, use_dora=True)
    with pytest.raises(InputError, match="DoRA"):
        load_adapter(path)
    with pytest.raises(InputError, match="adapter directory not found"):
        load_adapter(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no adapter_config.json"):
        load_adapter(tmp_path / "empty")


def test_capability_list_not_matching_the_adapters(base, tmp_path):
    adapters = [load_adapter(make_adapter(base, tmp_path / n, seed=i)) for i, n in enumerate(["alpha", "beta"])]
    with pytest.raises(InputError, match="capability list does not match the adapters"):
        compose(copy.deepcopy(base), adapters, [Capability(name="alpha"), Capability(name="gamma")])
    listing = capabilities_file(tmp_path / "capabilities.json", ["alpha"])
    with pytest.raises(InputError, match=r"no capability named \['beta'\]"):
        capabilities_for(adapters, str(listing))
    capabilities_file(listing, ["gamma"], ["alpha", "beta"])
    with pytest.raises(InputError, match=r"no adapter for \['gamma'\]"):
        capabilities_for(adapters, str(listing))
    capabilities_file(listing, ["beta", "alpha"], ["delta"], descriptions={"alpha": "a", "beta": "b"})
    assert [(c.name, c.description) for c in capabilities_for(adapters, str(listing))] == [("alpha", "a"), ("beta", "b")]
    given = [Capability(name="beta", description="b"), Capability(name="alpha", description="a")]
    assert capabilities_for(adapters, None, given) == given[::-1]  # or the capabilities themselves, in adapter order
    with pytest.raises(InputError, match=r"no adapter for \['gamma'\]"):
        capabilities_for(adapters, None, [*given, Capability(name="gamma")])
    listing.write_text(json.dumps([{"name": "alpha"}, {"name": "beta"}]))  # a bare list is not a capabilities.json
    with pytest.raises(InputError, match=r"capabilities.json: expected a JSON object \(CapabilitiesFile\), got list"):
        capabilities_for(adapters, str(listing))
    with pytest.raises(InputError, match="adapter name 'not-snake' is not a snake_case capability name"):
        compose(copy.deepcopy(base), [load_adapter(adapters[0].path, name="not-snake")])


def test_target_openings_for_gates_that_route_each_token(base, tmp_path):
    from tracerl.composition.build import ComposeOptions, build_composition
    from tracerl.core.messages import Message
    from tracerl.core.trajectory import Trajectory

    target = [Trajectory(task_id="t0", domain="target", messages=[Message.user("cancel it")], info={"lacking": ["a"]})]
    with pytest.raises(InputError, match="fit only the gates of a moe routed at the opening"):
        build_composition([str(make_adapter(base, tmp_path / "a", seed=1))], "unused", tmp_path / "out",
                          ComposeOptions(mode="moe", moe_routing="token", target=target))
    assert not (tmp_path / "out").exists()
