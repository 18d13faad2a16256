"""Environment modules for the sandbox and LLM tests: the known-good one, broken variants, hostile ones."""

from pathlib import Path

from tracerl.synthesis.llm import EXAMPLE_MODULE

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
