"""The embedded tiny agent: a Qwen3-architecture checkpoint with its tokenizer, made by `tracerl build-agent`.

Load it with `transformers.AutoModelForCausalLM.from_pretrained(TINY_AGENT_DIR)` (and
`AutoTokenizer`), or `tracerl.models.load_model("tiny-agent")`. `build.json` beside the weights
records how it was made (command, seed, data size, minutes, parameters, tokens/s, pass rates).
"""

from pathlib import Path

TINY_AGENT_DIR = Path(__file__).resolve().parent
