"""A known-good environment module, as an LLM might write it: one read tool, one write tool.

Task: the user asks to apply the target's simplest write tool to one record; the record must be
read first and the write made with the exact values. Reward: 0.5 for the read, 0.5 for the write.
"""

import json
import random
from pathlib import Path

from tracerl.core.messages import Action, Message
from tracerl.envs.base import ToolEnv
from tracerl.envs.tools import Toolbox, ToolError, add_schema_tool
from tracerl.synthesis.target import Target, tool_families
from tracerl.synthesis.values import id_value, sample_arguments

TARGET = Target.from_json(json.loads((Path(__file__).parent / "target.json").read_text()))
FAMILY = tool_families(TARGET.tools)[0]
ACT = FAMILY.acts[0]


class LookThenActEnv(ToolEnv):
    name = "look_then_act"
    max_turns = 8

    def __init__(self, difficulty=1):
        super().__init__()
        self.difficulty = difficulty

    def _task(self, seed):
        rng = random.Random(f"look-then-act|{self.difficulty}|{seed}")
        record_id = id_value(FAMILY.check.parameters["properties"][FAMILY.id_param], FAMILY.id_param, rng)
        args = sample_arguments(ACT, rng, {FAMILY.id_param: record_id})
        return record_id, args

    def oracle(self, seed):
        record_id, args = self._task(seed)
        return [Action(name=FAMILY.check.name, arguments={FAMILY.id_param: record_id}), Action(name=ACT.name, arguments=args)]

    def _setup(self, seed, options):
        record_id, args = self._task(seed)
        self.record = {FAMILY.id_param: record_id, "status": "active"}
        self.read = False
        self.written = None
        toolbox = Toolbox()

        def check(**kw):
            if kw[FAMILY.id_param] != record_id:
                raise ToolError("not found")
            self.read = True
            return dict(self.record)

        def act(**kw):
            if kw[FAMILY.id_param] != record_id:
                raise ToolError("not found")
            self.written = kw
            self.record["status"] = "done"
            return dict(self.record)

        add_schema_tool(toolbox, FAMILY.check, check)
        add_schema_tool(toolbox, ACT, act)
        self.expected = args
        hint = "Look the record up before you change it, then copy the user's values exactly."
        system = f"{TARGET.title}\n\nLook a record up before changing it."
        request = f"Please {ACT.name.replace('_', ' ')} with {json.dumps(args)}."
        plain = [Message.system(system), Message.user(request)]
        opening = [Message.system(system + "\n\n## Expert guidance\n" + hint), plain[1]] if options.get("hint") else plain
        info = {"task_id": str(seed), "_prompt_without_hint": plain, "_hint": hint}
        return toolbox, opening, info

    def _user_reply(self, text):
        return "Thanks.", True

    def _score(self):
        wrote = self.written is not None and all(self.written.get(k) == v for k, v in self.expected.items())
        return 0.5 * self.read + 0.5 * wrote, {"read": float(self.read), "write": float(wrote)}


def make_env(difficulty=1):
    return LookThenActEnv(difficulty)
