"""The `--analysis-*` options of every command that asks the analysis model (`tracerl select`, `tracerl
synthesize`): the names of the run config's `analysis:` section (`tracerl.models.analysis.AnalysisConfig`),
with `--analysis-config FILE` for a YAML file of that section."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

BASE_URL = typer.Option(None, "--analysis-base-url", help="The analysis model's OpenAI-compatible endpoint, e.g. "
                        "http://127.0.0.1:8000/v1 (default: $OPENAI_BASE_URL).")
MODEL = typer.Option(None, "--analysis-model", help="The analysis model's name on that endpoint (default: "
                     "$TRACERL_LLM_MODEL or $OPENAI_MODEL).")
API_KEY_ENV = typer.Option(None, "--analysis-api-key-env", help="The environment variable holding its API key "
                           "(default OPENAI_API_KEY).")
TEMPERATURE = typer.Option(None, "--analysis-temperature", help="Its sampling temperature (default 0.7).")
CONCURRENCY = typer.Option(None, "--analysis-concurrency", help="Requests in flight at most (default 8).")
TIMEOUT = typer.Option(None, "--analysis-timeout", help="Seconds per request (default 60).")
MAX_RETRIES = typer.Option(None, "--analysis-max-retries", help="Retries per request, with exponential backoff "
                           "(default 3).")
CONFIG = typer.Option(None, "--analysis-config", help="A YAML file of the analysis settings (the run config's "
                      "`analysis:` section, or a run config holding one); the options above override it.")


def analysis_config(config: Optional[Path], **options: Any) -> Any:
    """The `AnalysisConfig` of a command: `--analysis-config`'s file, then the options given over it."""
    from pydantic import ValidationError

    from tracerl.core.config_file import load_yaml, validate_config
    from tracerl.core.errors import InputError
    from tracerl.core.io import describe_validation_error
    from tracerl.models.analysis import AnalysisConfig

    given = {k: v for k, v in options.items() if v is not None}
    if config is not None:
        data, node = load_yaml(config)
        if isinstance(data.get("analysis"), dict):  # a run config: its `analysis:` section
            data, node = data["analysis"], None
        base = validate_config(AnalysisConfig, data, path=config, node=node)
        given = {**base.model_dump(exclude_unset=True), **given}
    try:
        return AnalysisConfig.model_validate(given)
    except ValidationError as e:
        raise InputError(f"analysis settings: {describe_validation_error(e)}") from None
