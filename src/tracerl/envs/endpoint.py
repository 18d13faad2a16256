"""An OpenAI-compatible chat endpoint a live target's own parts call (a user simulator, a judge), and
the check that it answers before the first episode."""

from __future__ import annotations

import os
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from tracerl.core.errors import InputError


class Endpoint(BaseModel):
    """An OpenAI-compatible chat endpoint (vLLM, `tracerl serve`, a hosted API)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="the served model name")
    base_url: str | None = Field(None, description="e.g. http://127.0.0.1:8000/v1; None = the provider's own "
                                 "(litellm's routing by model name for τ²-bench, api.openai.com for ToolSandBox)")
    api_key_env: str | None = Field(None, description="the environment variable holding the key; None = no key")
    temperature: float = Field(0.0, ge=0)
    max_tokens: int | None = Field(None, ge=1, description="cap on each answer (None: the endpoint's default)")
    tool_choice: Literal["auto", "none"] | None = Field(
        None, description="sent with requests that offer tools (None: not sent, the endpoint's default 'auto'); 'none' "
        "keeps a simulated user from calling its tools — it then cannot end the conversation itself")

    def describe(self) -> dict[str, Any]:
        out = {"model": self.model, "base_url": self.base_url, "temperature": self.temperature,
               "max_tokens": self.max_tokens}
        return {**out, "tool_choice": self.tool_choice} if self.tool_choice else out

    def for_bridge(self) -> dict[str, Any]:
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return {**self.describe(), "api_key": key}


_CHECKED: set[str] = set()


def check_endpoint(setting: str, endpoint: Endpoint) -> None:
    """One GET of the endpoint's /models: it answers, and serves the model when it lists models.
    `setting` names it in the one-line error (e.g. 'tau2.user')."""
    if endpoint.base_url is None:
        return
    url = endpoint.base_url.rstrip("/") + "/models"
    if url in _CHECKED:
        return
    key = os.environ.get(endpoint.api_key_env) if endpoint.api_key_env else None
    try:
        response = httpx.get(url, timeout=10, headers={"Authorization": f"Bearer {key}"} if key else None)
    except httpx.HTTPError as e:
        raise InputError(f"{setting}: the endpoint {endpoint.base_url} does not answer ({type(e).__name__}: {e})") from None
    if response.status_code == 200:
        try:
            served = [m.get("id") for m in response.json().get("data", [])]
        except (ValueError, AttributeError):
            served = []
        if served and endpoint.model.removeprefix("openai/") not in served:
            raise InputError(f"{setting}: {endpoint.base_url} does not serve '{endpoint.model}' (it serves: {', '.join(map(str, served))})")
    elif response.status_code in (401, 403):
        raise InputError(f"{setting}: {endpoint.base_url} refused the key (HTTP {response.status_code}; set {endpoint.api_key_env or 'api_key_env'})")
    _CHECKED.add(url)
