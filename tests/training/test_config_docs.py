"""Every TrainConfig field is documented as TRL documents GRPOConfig: its default and what it does."""

import ast
import re

import pytest
from pydantic_core import PydanticUndefined

from tracerl.training.config import LoraSettings, TrainConfig

FIELDS = [(model, name) for model in (TrainConfig, LoraSettings) for name in model.model_fields]


@pytest.mark.parametrize(("model", "name"), FIELDS, ids=[f"{m.__name__}.{n}" for m, n in FIELDS])
def test_field_states_its_real_default(model, name):
    field = model.model_fields[name]
    assert field.description and len(field.description) > 30, f"{name}: no description"
    if field.default is PydanticUndefined:  # a default_factory (nested settings, lists): described in words
        return
    found = re.search(r'default (".*?"|[\w.+-]+)', field.description)
    assert found, f"{name}: the description does not state the default"
    assert ast.literal_eval(found.group(1)) == field.default, f"{name}: states {found.group(1)}, is {field.default!r}"


def test_class_docstring_names_each_difference_from_trl():
    doc = TrainConfig.__doc__
    for needle in ("Constant groups are dropped", '"dapo"', "max_completion_length", "normaliser"):
        assert needle in doc
