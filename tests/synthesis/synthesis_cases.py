"""Environment modules for the sandbox and LLM tests: the known-good one, broken variants, hostile ones."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tracerl.core.confine import REQUIRED
from tracerl.envs.synthetic.sandbox import kernel_confinement
from tracerl.synthesis.llm import EXAMPLE_MODULE

CONFINED = set(REQUIRED) <= set(kernel_confinement())
# tests of the kernel's refusals: skipped where it offers no Landlock or seccomp (tests/conftest.py opts in there)
needs_confinement = pytest.mark.skipif(not CONFINED, reason="this kernel offers no Landlock or seccomp confinement")

GOOD = EXAMPLE_MODULE  # the known-good module: the example the generation prompt shows


def broken_oracle() -> str:
    return GOOD.replace("Action(name=ACT.name, arguments=args)]", "Action(name=ACT.name, arguments={**args, FAMILY.id_param: 'nope'})]")


def drifted_schema() -> str:
    return GOOD.replace(
        "add_schema_tool(toolbox, ACT, act)",
        "add_schema_tool(toolbox, ACT.model_copy(update={'parameters': {**ACT.parameters, 'required': []}}), act)",
    )


def nondeterministic() -> str:
    return GOOD.replace('random.Random(f"look-then-act|{self.difficulty}|{seed}")', "random.Random()")


SYNTAX_ERROR = "def make_env(:\n    pass\n"
INFINITE_LOOP = "while True:\n    pass\n"
SLEEPER = "import time\ntime.sleep(600)\n"
MEMORY_BOMB = "hoard = []\nwhile True:\n    hoard.append(bytearray(64 * 1024 * 1024))\n"
SUBPROCESS = "import subprocess\nsubprocess.run(['true'])\n"
SECRET_READER = GOOD + "\nimport os\nif os.environ.get('OPENAI_API_KEY'):\n    raise RuntimeError('saw the API key')\n"


def writer(path: Path) -> str:
    """Writes outside its folder at import time."""
    return f"open({str(path)!r}, 'w').write('escaped')\n" + GOOD


def connector(port: int) -> str:
    """Opens a TCP connection to a local server at import time."""
    return f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')\n" + GOOD


def raw_socket() -> str:
    return "import _socket\n_socket.socket()\n" + GOOD


def fenced(code: str) -> str:
    """As a chat model answers: some prose and a python code block."""
    return f"Here is the module.\n\n```python\n{code}```\n"


HOSTILE = Path(__file__).resolve().parents[1] / "data" / "hostile_envs"  # see its README.md


def hostile(name: str, settings: dict | None = None, base: str = "") -> str:
    """`base` (a module's source) followed by the hostile text `name`.py, its settings filled in."""
    text = (HOSTILE / f"{name}.py").read_text()
    return base + text.replace("__SETTINGS__", json.dumps(settings or {}))


def attacking(settings: dict, *, at: str) -> str:
    """The known-good module with every attack of attacks.py run at import ('import') or on each reset ('play')."""
    return hostile(f"attack_at_{at}", base=hostile("attacks", settings, base=GOOD))


class CannedServer:
    """An OpenAI-compatible /v1/chat/completions answering with the given texts in turn."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                text = outer.answers.pop(0) if outer.answers else "I have nothing more."
                payload = {"id": f"c{len(outer.requests)}", "object": "chat.completion", "created": 0,
                           "model": body["model"], "choices": [{"index": 0, "finish_reason": "stop",
                           "message": {"role": "assistant", "content": text}}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
