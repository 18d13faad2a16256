"""`tracerl serve` over real HTTP with the official openai client: tools, log-probs, adapters, bad input."""

import json
import threading

import httpx
import openai
import pytest
import torch
from openai import OpenAI
from peft import LoraConfig, get_peft_model

from tracerl.core.messages import Message
from tracerl.core.policy import Session
from tracerl.envs.runner import Episode, rollout
from tracerl.models.chat import ChatFormat
from tracerl.models.generation import GenerationRequest, generate
from tracerl.models.local import LocalPolicy
from tracerl.models.remote import RemotePolicy, RemotePolicyError
from tracerl.serve.server import ServerThread, free_port

TOOL_CALL = '<tool_call>\n{"name": "get_price", "arguments": {"item_id":"A1"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tool_model(toy, tokenizer):
    """The toy model taught (a few dozen steps) to answer the store prompt with one tool call."""
    torch.manual_seed(0)
    model = toy.make_model(tokenizer)
    chat = ChatFormat(tokenizer)
    env = toy.StoreEnv()
    messages, _ = env.reset(seed=1)
    prompt = chat.prompt_ids(messages, env.tools)
    target = chat.encode(TOOL_CALL + "<|im_end|>")
    ids = torch.tensor([prompt + target])
    labels = torch.tensor([[-100] * len(prompt) + target])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(60):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    return model


@pytest.fixture(scope="module")
def server(tool_model, tokenizer):
    policy = LocalPolicy(tool_model, tokenizer)
    with ServerThread(policy, served_model_name="toy", max_tokens_limit=64, max_request_bytes=20_000) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)


def store_chat(toy):
    env = toy.StoreEnv()
    messages, _ = env.reset(seed=1)
    return [m.to_openai() for m in messages], [t.to_openai() for t in env.tools]


def test_models_lists_the_base_model(client):
    assert [m.id for m in client.models.list().data] == ["toy"]


def test_chat_with_tools_returns_parseable_tool_calls(client, toy):
    messages, tools = store_chat(toy)
    response = client.chat.completions.create(model="toy", messages=messages, tools=tools, temperature=0, max_tokens=40)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_price"
    assert json.loads(call.function.arguments) == {"item_id": "A1"}
    # the environment accepts it
    env = toy.StoreEnv()
    env.reset(seed=1)
    reply = Message.assistant(tool_calls=[{"id": call.id, "function": {"name": call.function.name, "arguments": call.function.arguments}}])
    out, *_ = env.step(reply)
    assert json.loads(out[0].content) == {"item_id": "A1", "price": 6}


def test_without_tools_the_text_is_the_answer(client, toy):
    """No tools offered (τ²-bench's user simulator) or tool_choice 'none': no tool_calls, as OpenAI and
    vLLM answer; the same greedy reply that is a tool call when tools are offered comes back as text,
    and so does a malformed call (cut short), as vLLM's hermes parser returns it: OpenAI clients such as
    τ²-bench json-decode every call's arguments."""
    messages, tools = store_chat(toy)
    response = client.chat.completions.create(model="toy", messages=messages, tools=tools, tool_choice="none",
                                              temperature=0, max_tokens=40)
    choice = response.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert json.loads(choice.message.content.split("<tool_call>")[1].split("</tool_call>")[0]) == \
        {"name": "get_price", "arguments": {"item_id": "A1"}}
    plain = client.chat.completions.create(model="toy", messages=messages, temperature=0, max_tokens=40).choices[0]
    assert plain.message.tool_calls is None and isinstance(plain.message.content, str)
    cut = client.chat.completions.create(model="toy", messages=messages, tools=tools, temperature=0, max_tokens=8).choices[0]
    assert cut.message.tool_calls is None and cut.message.content.startswith("<tool_call>")  # malformed: text
    assert cut.finish_reason == "length"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_completion_logprobs_match_the_local_backend(client, tool_model, tokenizer, toy, temperature):
    messages, tools = store_chat(toy)
    chat = ChatFormat(tokenizer)
    prompt = chat.encode(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True))
    response = client.completions.create(model="toy", prompt=prompt, max_tokens=12, temperature=temperature, seed=7,
                                         logprobs=1, extra_body={"return_token_ids": True})
    choice = response.choices[0]
    ids = choice.model_extra["token_ids"]
    served = choice.logprobs.token_logprobs
    # the local backend on the same tokens: its own sampling path (greedy) and a plain forward
    if temperature == 0:
        local = generate(tool_model, [GenerationRequest(prompt, max_new_tokens=12, temperature=0, stop_ids=chat.stop_ids)])[0]
        assert local.token_ids == ids
        assert served == pytest.approx(local.logprobs, abs=1e-4)
    with torch.no_grad():
        logits = tool_model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
    forced = torch.log_softmax(logits, -1)
    expected = [forced[len(prompt) - 1 + k, t].item() for k, t in enumerate(ids)]
    assert served == pytest.approx(expected, abs=1e-4)
    assert choice.logprobs.tokens == [tokenizer.decode([t]) for t in ids]


def test_tokens_as_token_ids_and_seeded_sampling(client):
    kwargs = dict(model="toy", prompt=[5, 6, 7], max_tokens=8, temperature=1.0, logprobs=0, seed=3,
                  extra_body={"return_tokens_as_token_ids": True})
    a = client.completions.create(**kwargs).choices[0]
    b = client.completions.create(**kwargs).choices[0]
    assert a.logprobs.tokens == b.logprobs.tokens
    assert all(t.startswith("token_id:") for t in a.logprobs.tokens)


def test_bad_input_is_a_clear_4xx_and_the_server_keeps_serving(client, server):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 2048 tokens"):
        client.completions.create(model="toy", prompt=[5] * 2100, max_tokens=4)
    with pytest.raises(openai.NotFoundError, match="The model `nobody` does not exist"):
        client.completions.create(model="nobody", prompt=[5, 6], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="max_tokens is 500; this server allows at most 64"):
        client.completions.create(model="toy", prompt=[5, 6], max_tokens=500)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="toy", prompt=[5, 6], max_tokens=4, temperature=-1)
    with pytest.raises(openai.BadRequestError, match="token id 999999 is out of range"):
        client.completions.create(model="toy", prompt=[5, 999999], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="messages.0"):
        client.chat.completions.create(model="toy", messages=[{"role": "wizard", "content": "hi"}], max_tokens=4)
    raw = httpx.post(server.base_url + "/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert raw.status_code == 400 and "not valid JSON" in raw.json()["error"]["message"]
    raw = httpx.post(server.base_url + "/completions", json={"prompt": [5]})
    assert raw.status_code == 400 and raw.json()["error"]["message"] == "missing field 'model'"
    raw = httpx.post(server.base_url + "/completions", json={"model": "toy", "prompt": "x" * 30_000})
    assert raw.status_code == 413
    with pytest.raises(openai.NotFoundError, match="cannot be found"):
        client.post("/unload_lora_adapter", body={"lora_name": "ghost"}, cast_to=httpx.Response)
    with pytest.raises(openai.BadRequestError, match="/nonexistent: not an adapter folder"):
        client.post("/load_lora_adapter", body={"lora_name": "x", "lora_path": "/nonexistent"}, cast_to=httpx.Response)
    ok = client.completions.create(model="toy", prompt=[5, 6], max_tokens=3, temperature=0)
    assert len(ok.choices[0].text) > 0


def test_sixteen_concurrent_clients_get_what_they_would_get_alone(client):
    prompts = [[5 + k, 6, 7 + k % 3] for k in range(16)]
    alone = [client.completions.create(model="toy", prompt=p, max_tokens=6, temperature=0, logprobs=0).choices[0] for p in prompts]
    together = [None] * 16

    def ask(k):
        together[k] = client.completions.create(model="toy", prompt=prompts[k], max_tokens=6, temperature=0, logprobs=0).choices[0]

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for a, b in zip(alone, together):
        assert b is not None and b.text == a.text
        assert b.logprobs.token_logprobs == pytest.approx(a.logprobs.token_logprobs, abs=1e-4)


def test_api_key_is_required_when_set(tool_model, tokenizer):
    with ServerThread(LocalPolicy(tool_model, tokenizer), served_model_name="toy", api_key="s3cret") as srv:
        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=srv.base_url, api_key="wrong", max_retries=0).models.list()
        assert OpenAI(base_url=srv.base_url, api_key="s3cret").models.list().data[0].id == "toy"
        assert srv.host == "127.0.0.1"


def test_remote_policy_hot_swaps_adapters_and_keeps_exact_records(toy, tokenizer, tool_model, tmp_path):
    torch.manual_seed(1)
    lora = get_peft_model(toy.make_model(tokenizer), LoraConfig(r=4, init_lora_weights=False, target_modules=["q_proj", "v_proj"]))
    lora.save_pretrained(tmp_path / "cap")
    local = LocalPolicy(toy.make_model(tokenizer), tokenizer)
    with ServerThread(local, served_model_name="toy") as srv:
        remote = RemotePolicy(srv.base_url, tokenizer, model="toy", temperature=1.0, max_new_tokens=12, seed=0)
        remote.swap_adapter("cap", tmp_path / "cap")  # not loaded yet: unload is skipped
        remote.swap_adapter("cap", tmp_path / "cap")  # loaded: unload, then load
        assert remote.list_models() == ["toy", "cap"]
        trajs = rollout(toy.StoreEnv, remote, [Episode(seed=1, adapter="cap"), Episode(seed=1)], batch_size=2)
        with pytest.raises(RemotePolicyError, match="404"):
            remote.act([Session(messages=[Message.user("hi")], tools=[], adapter="ghost")])
        remote.unload_adapter("cap")
        assert remote.list_models() == ["toy"]
    reference = LocalPolicy(toy.make_model(tokenizer), tokenizer)
    reference.load_adapter("cap", tmp_path / "cap")
    for t, adapter in zip(trajs, ["cap", None]):
        rec = t.tokens
        kwargs = {"adapter_names": [adapter or "__base__"]}
        with torch.no_grad():
            logits = reference.model(input_ids=torch.tensor([rec.ids]), **kwargs).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        for i, m in enumerate(rec.mask):
            if m:
                assert rec.logprobs[i] == pytest.approx(lp[i - 1, rec.ids[i]].item(), abs=1e-4)


def test_remote_policy_reports_a_dead_endpoint(tokenizer):
    remote = RemotePolicy(f"http://127.0.0.1:{free_port()}/v1", tokenizer, model="toy", max_retries=1, timeout=2)
    with pytest.raises(RemotePolicyError, match="no answer"):
        remote.act([Session(messages=[Message.user("hi")], tools=[])])


def test_the_shipped_agent_answers_with_a_tool_call_over_http():
    from tracerl.envs.airline import TEST_SEEDS
    from tracerl.envs.airline.reference import GREETING
    from tracerl.envs.registry import make_env
    from tracerl.models.local import load_model

    model, tok = load_model("tiny-agent", device="cpu")
    env = make_env("airline", split="test")
    messages, _ = env.reset(seed=TEST_SEEDS[0])
    out, *_ = env.step(Message.assistant(GREETING))  # the user gives their id
    conversation = [m.to_openai() for m in messages + [Message.assistant(GREETING)] + out]
    with ServerThread(LocalPolicy(model, tok), served_model_name="tiny-agent") as srv:
        client = OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        reply = client.chat.completions.create(model="tiny-agent", messages=conversation,
                                               tools=[t.to_openai() for t in env.tools], temperature=0, max_tokens=64)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_user_details"
    assert set(json.loads(call.function.arguments)) == {"user_id"}


@pytest.fixture(scope="module")
def bad_adapters(toy, tokenizer, tmp_path_factory):
    """A good adapter of the toy model, the same cut in half, and one of a wider model."""
    from tracerl.models.tiny import tiny_qwen3, tiny_qwen3_config

    root = tmp_path_factory.mktemp("adapters")
    torch.manual_seed(2)
    good = get_peft_model(toy.make_model(tokenizer), LoraConfig(r=4, init_lora_weights=False, target_modules=["q_proj"]))
    good.save_pretrained(root / "good")
    (root / "corrupt").mkdir()
    (root / "corrupt" / "adapter_config.json").write_bytes((root / "good" / "adapter_config.json").read_bytes())
    weights = (root / "good" / "adapter_model.safetensors").read_bytes()
    (root / "corrupt" / "adapter_model.safetensors").write_bytes(weights[: len(weights) // 2])
    wide = tiny_qwen3(tiny_qwen3_config(len(tokenizer), hidden_size=64), seed=0)
    get_peft_model(wide, LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(root / "other")
    return root


def test_a_failed_adapter_load_registers_nothing(client, server, bad_adapters):
    def models():
        return [m.id for m in client.models.list().data]

    for kind, message in (("corrupt", "cannot read the weights"), ("other", "does not fit the base model")):
        with pytest.raises(openai.BadRequestError, match=message):
            client.post("/load_lora_adapter", body={"lora_name": kind, "lora_path": str(bad_adapters / kind)},
                        cast_to=httpx.Response)
        assert models() == ["toy"]
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=kind, prompt=[5, 6], max_tokens=2)
    # replacing a loaded adapter in place with a bad one leaves the loaded one serving
    client.post("/load_lora_adapter", body={"lora_name": "cap", "lora_path": str(bad_adapters / "good")},
                cast_to=httpx.Response)
    before = client.completions.create(model="cap", prompt=[5, 6], max_tokens=4, temperature=0, logprobs=0).choices[0]
    with pytest.raises(openai.BadRequestError):
        client.post("/load_lora_adapter", body={"lora_name": "cap", "lora_path": str(bad_adapters / "other"),
                                                "load_inplace": True}, cast_to=httpx.Response)
    after = client.completions.create(model="cap", prompt=[5, 6], max_tokens=4, temperature=0, logprobs=0).choices[0]
    assert models() == ["toy", "cap"] and after.text == before.text
    assert after.logprobs.token_logprobs == before.logprobs.token_logprobs
    client.post("/unload_lora_adapter", body={"lora_name": "cap"}, cast_to=httpx.Response)
    assert models() == ["toy"]


def test_malformed_structures_are_400_never_500(server):
    url = server.base_url
    deep = b'{"model": "toy", "messages": ' + b"[" * 9000 + b"]" * 9000 + b"}"  # within the 20 KB limit
    cases = [
        ("/chat/completions", deep),
        ("/chat/completions", json.dumps({"model": "toy", "messages": [{"role": "user", "content": "hi"}],
                                          "tools": [{"type": "function", "function": "get_price"}]}).encode()),
        ("/chat/completions", json.dumps({"model": "toy", "messages": [{"role": "user", "content": "hi"}],
                                          "tools": ["get_price"]}).encode()),
        ("/chat/completions", json.dumps({"model": "toy", "messages": [{"role": "user", "content": "hi"}],
                                          "tools": [{"type": "function", "function": {"name": 3}}]}).encode()),
        ("/chat/completions", json.dumps({"model": "toy", "messages": [{"role": "user",
                                          "content": [{"type": "text", "text": {"a": 1}}]}]}).encode()),
        ("/chat/completions", json.dumps({"model": "toy", "messages": [{"role": "assistant",
                                          "tool_calls": ["get_price"]}]}).encode()),
        ("/chat/completions", json.dumps({"model": "toy", "messages": [{"role": "user", "content": "hi",
                                          "name": {"deep": [[[[{}]]]]}}]}).encode()),
        ("/completions", json.dumps({"model": "toy", "prompt": [[5, "x"]]}).encode()),
        ("/completions", json.dumps({"model": "toy", "prompt": {"text": "hi"}}).encode()),
        ("/load_lora_adapter", json.dumps({"lora_name": ["x"], "lora_path": {}}).encode()),
        ("/completions", b'{"model": "toy", "prompt": "\xff\xfe"}'),
    ]
    for path, body in cases:
        response = httpx.post(url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
        assert response.status_code == 400, (path, body[:120], response.text[:300])
        assert response.json()["error"]["code"] == 400
    assert httpx.get(url + "/models").status_code == 200


def test_a_prompt_too_long_for_the_context_is_refused_before_it_is_tokenized(tool_model, tokenizer):
    from tracerl.serve.app import longest_token_bytes

    longest = longest_token_bytes(tokenizer)
    assert longest == max(len(t.encode()) for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
    limit = LocalPolicy(tool_model, tokenizer).max_context
    text = "x" * (longest * (limit - 1) + 1)  # needs at least `limit` tokens, however it is cut
    with ServerThread(LocalPolicy(tool_model, tokenizer), served_model_name="toy", max_request_bytes=len(text) + 1000) as srv:
        for path, body in (("/chat/completions", {"messages": [{"role": "user", "content": text}]}),
                           ("/completions", {"prompt": text})):
            response = httpx.post(srv.base_url + path, timeout=60, json={"model": "toy", **body})
            assert response.status_code == 400, response.text
            assert response.json()["error"]["message"] == (
                f"This model's maximum context length is {limit} tokens. However, the prompt's {len(text)} bytes of "
                f"text need at least {limit} tokens. Please reduce the length of the prompt.")
        short = httpx.post(srv.base_url + "/completions", timeout=60, json={"model": "toy", "prompt": "x" * 50,
                                                                             "max_tokens": 2})
        assert short.status_code == 200
