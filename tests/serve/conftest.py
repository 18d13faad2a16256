"""The serve tests use the model tests' toy model and tokenizer fixtures (one definition)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("tracerl_test_models_conftest",
                                               Path(__file__).parents[1] / "models" / "conftest.py")
_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_models)

TOY = _models.TOY
toy, tokenizer, model = _models.toy, _models.tokenizer, _models.model
