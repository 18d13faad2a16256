"""The vLLM hot-swap speaks vLLM's runtime LoRA API: unload, then load, with the adapter's absolute path."""

import json

import httpx
import pytest

from tracerl.training.backends import VLLMAdapterSync


def _recorder(status_for_unload: int = 200):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path, json.loads(request.content)))
        if request.url.path.endswith("unload_lora_adapter"):
            return httpx.Response(status_for_unload, text="not loaded")
        return httpx.Response(200, text="ok")

    return calls, httpx.Client(transport=httpx.MockTransport(handler))


def test_swap_unloads_then_loads(tmp_path):
    calls, client = _recorder()
    sync = VLLMAdapterSync("http://server:8000/v1", "precondition", client=client)
    sync.swap(tmp_path)
    assert calls == [
        ("POST", "/v1/unload_lora_adapter", {"lora_name": "precondition"}),
        ("POST", "/v1/load_lora_adapter", {"lora_name": "precondition", "lora_path": str(tmp_path.resolve())}),
    ]


def test_first_swap_tolerates_an_adapter_not_loaded_yet_later_ones_do_not(tmp_path):
    calls, client = _recorder(status_for_unload=404)
    sync = VLLMAdapterSync("http://server:8000", "a", client=client)
    sync.swap(tmp_path)  # nothing to unload on the first swap
    with pytest.raises(RuntimeError, match="unload"):
        sync.swap(tmp_path)
