"""`tracerl serve` as a command: a real subprocess on a free 127.0.0.1 port, always terminated."""

import subprocess
import sys
import time

import httpx
import pytest
from openai import OpenAI

from tracerl.cli import main
from tracerl.serve.server import free_port


@pytest.mark.slow
def test_tracerl_serve_subprocess(toy, tokenizer, model, tmp_path):
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    port = free_port()
    code = "import sys; from tracerl.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--model", str(tmp_path / "m"), "--served-model-name", "toy",
                             "--port", str(port), "--device", "cpu", "--api-key", "k"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.time() < deadline, "server did not start"
            time.sleep(0.3)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["toy"]
        env = toy.StoreEnv()
        messages, _ = env.reset(seed=0)
        reply = client.chat.completions.create(model="toy", messages=[m.to_openai() for m in messages],
                                               tools=[t.to_openai() for t in env.tools], max_tokens=5, temperature=0)
        assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens <= 5
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_serve_bad_flags_exit_2(capsys, tmp_path):
    assert main(["serve", "--lora", "no-equals-sign"]) == 2
    assert "NAME=PATH" in capsys.readouterr().err
    assert main(["serve", "--lora", f"x={tmp_path}"]) == 2
    assert main(["serve", "--logprobs-mode", "weird"]) == 2
    assert main(["serve", "--model", str(tmp_path / "missing")]) == 2
