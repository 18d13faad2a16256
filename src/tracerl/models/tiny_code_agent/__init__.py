"""The tiny code agent: a Qwen3-architecture checkpoint with its tokenizer for the built-in code
domain, made by `tracerl build-agent --recipe configs/tiny-code-agent.json`; `build.json` beside the
weights records its recipe, data, minutes and pass rates. `tracerl.models.load_model("tiny-code-agent")`
loads it; `configs/code-demo.yaml` runs TRACE on it.
"""

from pathlib import Path

TINY_CODE_AGENT_DIR = Path(__file__).resolve().parent
