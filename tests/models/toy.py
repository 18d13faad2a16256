"""Test fixtures shared by tests/models and tests/serve: a small tokenizer, a tiny random Qwen3, a toy ToolEnv."""

from __future__ import annotations

import json
from typing import Any

from tracerl.core.messages import Message
from tracerl.envs.base import ToolEnv
from tracerl.envs.tools import Toolbox, ToolError, tool
from tracerl.models.templates import TINY_AGENT_TEMPLATE
from tracerl.models.tiny import tiny_qwen3, tiny_qwen3_config
from tracerl.models.tokenizer import train_tokenizer

SYSTEM = "You are a store agent. Look up an item before you set its price."


class StoreTools(Toolbox):
    def __init__(self, prices: dict[str, int]):
        self.prices = dict(prices)
        super().__init__()

    @tool("read")
    def get_price(self, item_id: str) -> dict:
        """Get the price of an item.

        Args:
            item_id: The item id, such as 'A1'.
        """
        if item_id not in self.prices:
            raise ToolError(f"item {item_id} not found")
        return {"item_id": item_id, "price": self.prices[item_id]}

    @tool("write")
    def set_price(self, item_id: str, price: int) -> str:
        """Set the price of an item.

        Args:
            item_id: The item id.
            price: The new price in dollars.
        """
        if item_id not in self.prices:
            raise ToolError(f"item {item_id} not found")
        self.prices[item_id] = price
        return "ok"


class StoreEnv(ToolEnv):
    """Set item A<seed % 3> to a price; the user asks to go on twice, then says thanks and stops."""

    name = "store"
    max_turns = 6

    def _setup(self, seed: int, options: dict[str, Any]):
        self.target = (f"A{seed % 3}", 10 + seed % 7)
        self.box = StoreTools({"A0": 5, "A1": 6, "A2": 7})
        self.replies = 0
        opening = [Message.system(SYSTEM), Message.user(f"Please set the price of {self.target[0]} to {self.target[1]}.")]
        return self.box, opening, {"task_id": f"store_{seed}"}

    def _user_reply(self, text: str):
        self.replies = getattr(self, "replies", 0) + 1
        if self.replies < 3:
            return "Please go on.", False
        return "Thanks, bye.", True

    def _score(self):
        ok = self.box.prices[self.target[0]] == self.target[1]
        return float(ok), {"db": float(ok)}


def corpus() -> list[str]:
    texts = [SYSTEM, "Thanks, bye.", "Please go on.", "Done. The price is set.", "I will look it up."]
    for i in range(3):
        for p in range(10, 17):
            texts.append(f"Please set the price of A{i} to {p}.")
            texts.append('<tool_call>\n{"name": "set_price", "arguments": ' + json.dumps({"item_id": f"A{i}", "price": p}, separators=(",", ":"), sort_keys=True) + "}\n</tool_call>")
            texts.append(json.dumps({"item_id": f"A{i}", "price": p}, sort_keys=True))
    return texts * 3


def make_tokenizer(vocab_size: int = 400):
    return train_tokenizer(corpus(), vocab_size=vocab_size, chat_template=TINY_AGENT_TEMPLATE)


def make_model(tokenizer, seed: int = 0, max_positions: int = 2048):
    config = tiny_qwen3_config(len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, max_position_embeddings=max_positions,
                               pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return tiny_qwen3(config, seed=seed)
