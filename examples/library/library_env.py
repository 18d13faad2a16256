"""A small library-loans domain: a user environment for tracerl, written against its `Env` contract.

    target:
      env: library_env:make_env      # this module on the Python path (PYTHONPATH=examples/library)

A task (one seed) is one member with two or three loans and one request: renew a loan, which the
policy forbids when the loan is overdue or has been renewed twice, or return one. The agent reads
the loan with `get_loan_details`, decides, and writes with `renew_loan` / `return_loan`. The reward
replays the agent's writes on a fresh copy of the task's loans and compares the result with the
gold actions' (1.0 or 0.0), as τ²-bench's database check does.

What tracerl reads from it (docs/your-environment.md):
- `tools` with their kinds (read / write / generic): the rules labeller and synthesis need them;
- `info["gold_actions"]` from reset: the rules labeller matches the agent's writes against them;
- `task_seeds` per split (train: seeds 0–999, test: 1000–1999);
- `oracle(seed)`, `reference_policy("oracle")`, `hint(seed)` and `user_requests(seed)`: optional; with
  them synthesis copies the users' own requests and the result shapes into its environments.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from tracerl.core.messages import Action, Message, ToolCall
from tracerl.core.policy import Session
from tracerl.envs.base import ToolEnv, UserRequest
from tracerl.envs.prompts import with_hint
from tracerl.envs.scripted_user import ScriptedUser, request_questions
from tracerl.envs.tools import Toolbox, ToolError, tool

POLICY = """\
# Library agent policy
You help members of the city library with their book loans. Look a loan up with get_loan_details before you change it, and make one tool call at a time.
Renew loan: not if the loan is overdue, and not if it has been renewed twice already. Otherwise renew it with renew_loan.
Return loan: always allowed; record it with return_loan.
If you cannot do what the member asks, make no change and say that you cannot, and why."""
HINT = ("Before renewing a loan, look it up with get_loan_details and check its due date and its renewals "
        "against the policy. Renew only if the policy allows it; otherwise make no change and tell the member why.")
SPLITS = {"train": range(0, 1000), "test": range(1000, 2000)}
TITLES = ("Dune", "Middlemarch", "Beloved", "Solaris", "Emma", "Ulysses", "Kindred", "Persuasion")
NAMES = ("ada", "bo", "cy", "dee", "eli", "fay", "gus", "hal")
TODAY = "2025-03-10"


class LibraryTools(Toolbox):
    """The domain's tools over one state: {user_id: {...}}, {loan_id: {...}}."""

    def bind(self, users: dict[str, Any], loans: dict[str, Any]) -> LibraryTools:
        self.users, self.loans = users, loans
        return self

    def _loan(self, loan_id: str) -> dict[str, Any]:
        if loan_id not in self.loans:
            raise ToolError(f"loan {loan_id} not found")
        return self.loans[loan_id]

    @tool("read")
    def get_user_details(self, user_id: str) -> dict:
        """Get a member's details, including their loans.

        Args:
            user_id: The member's id, such as 'ada_1024'.
        """
        if user_id not in self.users:
            raise ToolError(f"user {user_id} not found")
        return copy.deepcopy(self.users[user_id])

    @tool("read")
    def get_loan_details(self, loan_id: str) -> dict:
        """Get a loan's details: its book, due date, whether it is overdue, and its renewals.

        Args:
            loan_id: The loan's id, such as 'L-4821'.
        """
        return copy.deepcopy(self._loan(loan_id))

    @tool("write")
    def renew_loan(self, loan_id: str) -> dict:
        """Renew a loan by three weeks.

        Args:
            loan_id: The loan's id.
        """
        loan = self._loan(loan_id)
        if loan["status"] != "active":
            raise ToolError(f"loan {loan_id} is {loan['status']}")
        loan["renewals"] += 1
        loan["due_date"] = _later(loan["due_date"])
        return copy.deepcopy(loan)

    @tool("write")
    def return_loan(self, loan_id: str) -> dict:
        """Record a loan's book as returned.

        Args:
            loan_id: The loan's id.
        """
        loan = self._loan(loan_id)
        if loan["status"] != "active":
            raise ToolError(f"loan {loan_id} is {loan['status']}")
        loan["status"] = "returned"
        return copy.deepcopy(loan)

    @tool("generic")
    def transfer_to_librarian(self, summary: str) -> str:
        """Hand the conversation to a librarian.

        Args:
            summary: What the member needs.
        """
        return "Transferred."


def _later(date: str) -> str:
    year, month, day = (int(x) for x in date.split("-"))
    day += 21
    if day > 28:
        day, month = day - 28, month + 1
    if month > 12:
        month, year = 1, year + 1
    return f"{year:04d}-{month:02d}-{day:02d}"


def generate_task(seed: int) -> dict[str, Any]:
    """The task of `seed`: the member, their loans, the request, whether the policy allows it, the gold."""
    rng = random.Random(f"library|{seed}")
    user_id = f"{rng.choice(NAMES)}_{rng.randint(1000, 9999)}"
    loans = {}
    for _ in range(rng.randint(2, 3)):
        loan_id = f"L-{rng.randint(1000, 9999)}"
        overdue = rng.random() < 0.35
        loans[loan_id] = {"loan_id": loan_id, "user_id": user_id, "title": rng.choice(TITLES),
                          "due_date": f"2025-0{2 if overdue else 3}-{rng.randint(11, 28):02d}", "overdue": overdue,
                          "renewals": rng.choice((0, 0, 1, 2)), "status": "active"}
    loan_id = rng.choice(sorted(loans))
    loan = loans[loan_id]
    kind = "renew" if rng.random() < 0.75 else "return"
    allowed = kind == "return" or (not loan["overdue"] and loan["renewals"] < 2)
    write = Action(name=f"{kind}_loan", arguments={"loan_id": loan_id})
    gold = [Action(name="get_loan_details", arguments={"loan_id": loan_id})] + ([write] if allowed else [])
    request = f"{kind} loan {loan_id} of {loan['title']}"
    users = {user_id: {"user_id": user_id, "name": user_id.split("_")[0].capitalize(), "loans": sorted(loans)}}
    return {"user_id": user_id, "users": users, "loans": loans, "request": request, "loan_id": loan_id,
            "kind": kind, "allowed": allowed, "write": write, "gold": gold}


class LibraryEnv(ToolEnv):
    """The library domain; `split` ("train", "test" or None) restricts the task seeds."""

    name = "library"
    max_turns = 12

    def __init__(self, split: str | None = None, max_turns: int | None = None):
        super().__init__(max_turns=max_turns)
        if split is not None and split not in SPLITS:
            raise ValueError(f"unknown split '{split}' (expected one of {', '.join(SPLITS)})")
        self.split = split
        self._tools = LibraryTools()

    @property
    def tools(self):
        return self._tools.schemas

    def task_seeds(self, n: int, offset: int = 0) -> list[int]:
        seeds = SPLITS[self.split] if self.split is not None else range(offset + n)
        if n < 0 or offset < 0 or offset + n > len(seeds):
            raise ValueError(f"the {self.split} split has {len(seeds)} tasks; asked for {n} after {offset}")
        return list(seeds[offset:offset + n])

    def _setup(self, seed, options):
        if self.split is not None and seed not in SPLITS[self.split]:
            raise ValueError(f"seed {seed} is not in the {self.split} split")
        self.task = generate_task(seed)
        self._tools.bind(copy.deepcopy(self.task["users"]), copy.deepcopy(self.task["loans"]))
        self.user = ScriptedUser([self.task["request"]], self.task["user_id"],
                                 [request_questions(self.task["loan_id"], entity="loan")])
        system = with_hint(POLICY, HINT) if options.get("hint") else POLICY
        info = {"task_id": f"library-{seed}", "gold_actions": [a.model_dump() for a in self.task["gold"]]}
        return self._tools, [Message.system(system), Message.user(self.user.opening())], info

    def _user_reply(self, text):
        return self.user.reply(text)

    def _end_after_tool(self, name: str) -> bool:
        return name == "transfer_to_librarian"

    def _score(self):
        writes = [Action(name=c.function.name, arguments=c.parsed_arguments() or {})
                  for m in self.messages if m.role == "assistant" for c in m.tool_calls or []
                  if self._tools.kind_of(c.function.name) == "write"]
        done = _replay(self.task, writes) == _replay(self.task, self.task["gold"])
        return (1.0 if done else 0.0), {"DB": 1.0 if done else 0.0}

    def oracle(self, seed: int) -> list[Action]:
        return list(generate_task(seed)["gold"])

    def hint(self, seed: int) -> str:
        return HINT

    def reference_policy(self, spec: str, seed: int = 0, **options: Any) -> OraclePolicy:
        if spec != "oracle":
            raise ValueError(f"unknown policy '{spec}' (the library domain has 'oracle')")
        return OraclePolicy()

    def user_requests(self, seed: int) -> list[UserRequest]:
        task = generate_task(seed)
        return [UserRequest(text=task["request"], user_id=task["user_id"], record_id=task["loan_id"],
                            write=task["write"], allowed=task["allowed"])]


def _replay(task: dict[str, Any], actions: list[Action]) -> dict[str, Any]:
    tools = LibraryTools().bind(copy.deepcopy(task["users"]), copy.deepcopy(task["loans"]))
    for action in actions:
        tools.call(action.name, action.arguments)
    return tools.loans


class OraclePolicy:
    """Plays each task's gold calls one per turn, then refuses or closes in words."""

    name = "oracle"

    def act(self, sessions: list[Session]) -> list[Message]:
        replies = []
        for session in sessions:
            gold = [Action.model_validate(a) for a in session.info["gold_actions"]]
            done = sum(len(m.tool_calls or []) for m in session.messages if m.role == "assistant")
            if done < len(gold):
                call = ToolCall.make(gold[done].name, gold[done].arguments, f"call_{done}")
                replies.append(Message.assistant(tool_calls=[call]))
            elif len(gold) == 1:
                replies.append(Message.assistant("I cannot do that: the policy does not allow it. Goodbye."))
            else:
                replies.append(Message.assistant("Done. Is there anything else?"))
        return replies


def make_env(split: str | None = None, **options: Any) -> LibraryEnv:
    """The factory `target.env: library_env:make_env` names (the pipeline passes `split`)."""
    return LibraryEnv(split=split, **options)
