"""Reference policies that need no model: `oracle` and `flawed` (the oracle with planted faults).

Both play the oracle's procedure for the airline domain: ask for the user id, read the user,
then for each request read the reservation (and search flights for a change), check the rule
(with `rule_check`, aloud: each condition of a cancellation or compensation rule answered in turn,
`SubTask.check`; with `cite_values` each answer after the values it reads, `SubTask.cited_check`),
state the action (and the amount it computed, if any) and ask to confirm, ask which payment method
to use when the write charges one (the user names the id again: a small model copies an id from
the message just before the call, docs/embedded-agent.md "What it is"), make the write,
and ask for the next request; refuse forbidden requests (asking for the next one in the same
message). The user gives its requests one at a time and ends when asked for one after the last.
Their episodes have a model's shape: one tool call (with an id) or one text per assistant turn.

`flawed` plants four faults, each drawn once per episode with its own probability, seeded by
(policy seed, task seed) — reproducible and independent of batching:

- `p1` skip_precondition: perform forbidden requests anyway, after the reads an allowed one gets
  (a cancellation the records forbid; a change of a basic_economy booking; a certificate nobody
  is owed) — the rule is ignored, never the read, so no demonstration writes on an unread record.
  With `rule_check` the episode says no rule check either, on allowed requests too: the check is
  then a behaviour the demonstrations show at 1 − p1 whatever the request, not a sign of refusal;
- `p2` stop_early: close after the first of several requests instead of asking for the next;
- `p3` mispick: in one request, pick the wrong record or amount (not the cheapest flight that
  meets the constraint, bags ignoring the free allowance, a wrong certificate amount) — each a
  different write, so the mistake changes the outcome;
- `p4` corrupt_argument: corrupt one argument of one gold write (a typo in an id, a wrong type).

A fault may be *scoped* to one sub-task kind (`flawed:1@cancel,1,1@change,1@bags`): it then acts only
on requests of that kind — `p1` ignores only that kind's rule, `p3` mis-picks only in such a
request, `p4` corrupts only such a write, and always the same way: its first count or amount
written with its unit ('3 bags', a wrong JSON type; a typo in an id when it has none) — an
imprecise argument that leaves every id right. A scoped fault with rate 1 is what a
student trained on the demonstrations reproduces under greedy decoding: a recurring gap tied to a
visible situation. Unscoped faults drawn with a rate below 1/2 mostly wash out under greedy
decoding, since the demonstrations then show the right action more often than the faulty one.

A drawn fault is *planted* when it changes the outcome (p1 needs a forbidden request, p2 a later
request with work to do, p3/p4 an allowed request among those the policy handles); every planted
fault makes the episode fail. The policy writes `session.info["faults"] = {"drawn": [...],
"planted": [...]}` (fault names), so rollouts carry their known failure composition — ground
truth for checking capability selection, not an input for labellers.
"""

from __future__ import annotations

import random
import string
from typing import Any

from tracerl.core.messages import Action, Message, ToolCall
from tracerl.core.policy import Session
from tracerl.envs.airline.tasks import AirlineTask, SubTask, SubTaskKind, generate_task

FAULTS = ("skip_precondition", "stop_early", "mispick", "corrupt_argument")  # p1, p2, p3, p4
SUBTASK_KINDS = SubTaskKind.__args__  # what a fault may be scoped to
GREETING = "Hello! Please tell me your user id."
NEXT_REQUEST = "Please tell me your next request."
CLOSING = "All your requests are handled. Is there anything else?"  # stop_early's close, and after the plan
PAYMENT_QUESTION = "Which payment method do you pay with?"  # asked after the user confirms a write that charges
DATE_QUESTION = "On which date do you want to fly?"  # asked right before a flight search


class ScriptedAirlinePolicy:
    """The oracle (`rates` all 0) or a flawed oracle; `rates` = (p1, p2, p3, p4)."""

    def __init__(self, rates: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0), seed: int = 0,
                 scopes: tuple[str | None, ...] = (None, None, None, None), rule_check: bool = False,
                 cite_values: bool = False):
        if len(rates) != len(FAULTS) or not all(0.0 <= p <= 1.0 for p in rates):
            raise ValueError(f"rates must be {len(FAULTS)} probabilities in [0, 1], got {rates}")
        if len(scopes) != len(FAULTS) or any(k is not None and k not in SUBTASK_KINDS for k in scopes) or scopes[1]:
            raise ValueError(f"scopes must be {len(FAULTS)} sub-task kinds or None (none for p2), got {scopes}")
        self.rates = tuple(float(p) for p in rates)
        self.scopes = tuple(scopes)
        self.seed = int(seed)
        if cite_values and not rule_check:
            raise ValueError("cite_values needs rule_check: it changes how the rule check is said")
        self.rule_check = bool(rule_check)
        self.cite_values = bool(cite_values)
        self.name = ("oracle" if not any(self.rates) else "flawed:" + ",".join(
            f"{p:g}" + (f"@{k}" if k else "") for p, k in zip(self.rates, self.scopes, strict=True))) + (
            " with rule checks" + (" citing values" if cite_values else "") if rule_check else "")

    def in_scope(self, fault: str, sub: SubTask) -> bool:
        scope = self.scopes[FAULTS.index(fault)]
        return scope is None or sub.kind == scope

    def act(self, sessions: list[Session]) -> list[Message]:
        return [self._next(s) for s in sessions]

    def _next(self, session: Session) -> Message:
        if session.state is None:
            task = generate_task(session.seed) if session.seed is not None else None
            if task is None or task.task_id != session.info.get("task_id"):
                raise TypeError("the scripted airline policies play the airline environment's tasks only")
            messages, drawn, planted = self.plan(task, hinted=bool(session.options.get("hint")))
            session.state = {"plan": messages, "next": 0}
            if any(self.rates):
                session.info["faults"] = {"drawn": drawn, "planted": planted}
        plan, index = session.state["plan"], session.state["next"]
        session.state["next"] = index + 1
        return plan[index] if index < len(plan) else Message.assistant(CLOSING)

    def plan(self, task: AirlineTask, hinted: bool = False) -> tuple[list[Message], list[str], list[str]]:
        """The assistant messages of the whole episode, the faults drawn and those planted. An episode
        with the expert guidance (`hinted`) follows it: skip_precondition is never drawn there."""
        rng = random.Random(f"tracerl-flawed-{self.seed}-{task.seed}")
        drawn = [name for name, p in zip(FAULTS, self.rates, strict=True)
                 if rng.random() < p and not (hinted and name == "skip_precondition")]
        subs = task.subtasks
        stop_early = "stop_early" in drawn and len(subs) > 1
        handled = subs[:1] if stop_early else subs
        planted = []
        ignored = {i for i, s in enumerate(handled)
                   if "skip_precondition" in drawn and not s.allowed and self.in_scope("skip_precondition", s)}
        if ignored:
            planted.append("skip_precondition")
        if stop_early and any(s.writes or s.communicate for s in subs[1:]):
            planted.append("stop_early")
        allowed = [i for i, s in enumerate(handled) if s.allowed]
        mispick = None
        pickable = [i for i in allowed if mispick_changes_outcome(handled[i]) and self.in_scope("mispick", handled[i])]
        if "mispick" in drawn and pickable:
            mispick = rng.choice(pickable)
            planted.append("mispick")
        corrupt = None
        corruptible = [i for i in allowed if self.in_scope("corrupt_argument", handled[i])]
        if "corrupt_argument" in drawn and corruptible:
            i = rng.choice(corruptible)
            corrupt = (i, rng.randrange(len(handled[i].writes)))
            planted.append("corrupt_argument")
        scoped_corruption = self.scopes[FAULTS.index("corrupt_argument")] is not None

        def checked(i: int, text: str) -> str:
            """`text` after the rule check (`rule_check`), unless the episode skips the rule (`skip_precondition`)."""
            skip = "skip_precondition" in drawn and self.in_scope("skip_precondition", handled[i])
            check = handled[i].cited_check if self.cite_values else handled[i].check
            return text if skip or not (self.rule_check and check) else f"{check} {text}"

        script = _Script()
        script.say(GREETING)
        script.call(Action(name="get_user_details", arguments={"user_id": task.user_id}))
        for i, sub in enumerate(handled):
            if not sub.allowed and i not in ignored:
                script.reads(sub.reads)
                script.say(checked(i, f"{sub.say} {NEXT_REQUEST}"))
                continue
            reads, writes, text = _variant(sub, mispick == i)
            script.reads(reads)
            script.say(checked(i, text))
            if any("payment_id" in w.arguments for w in writes):
                script.say(PAYMENT_QUESTION)
            for j, write in enumerate(writes):
                if corrupt == (i, j):
                    write = with_unit(write) if scoped_corruption and _counts(write) else corrupt_action(write, task, rng)
                script.call(write)
            script.say(NEXT_REQUEST)
        if stop_early:
            script.messages[-1] = Message.assistant(CLOSING if handled[0].allowed or 0 in ignored
                                                    else checked(0, f"{handled[0].say} {CLOSING}"))
        return script.messages, drawn, planted


def mispick_changes_outcome(sub: SubTask) -> bool:
    """Whether mis-picking in `sub` fails the episode: it has a mis-picked write and that differs from
    the right one (a flight change, bag update or certificate; a cancellation has nothing to mis-pick)."""
    return sub.mispick_writes is not None and sub.mispick_writes != sub.writes


def _variant(sub: SubTask, mispick: bool) -> tuple[list[Action], list[Action], str]:
    """(reads, writes, confirmation) for handling `sub` as allowed: as it should, mis-picked, or against the rule."""
    if not sub.allowed:
        assert sub.anyway_say is not None
        return sub.anyway_reads, sub.anyway_writes, sub.anyway_say
    if mispick:
        assert sub.mispick_writes is not None and sub.mispick_say is not None
        return sub.reads, sub.mispick_writes, sub.mispick_say
    return sub.reads, sub.writes, sub.say


class _Script:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.count = 0

    def say(self, text: str) -> None:
        self.messages.append(Message.assistant(text))

    def call(self, action: Action) -> None:
        self.count += 1
        self.messages.append(Message.assistant(tool_calls=[ToolCall.make(action.name, action.arguments, f"call_{self.count}")]))

    def reads(self, actions: list[Action]) -> None:
        """The reads, a flight search after asking the user for the date (copied from the answer)."""
        for action in actions:
            if action.name == "search_direct_flight":
                self.say(DATE_QUESTION)
            self.call(action)


_UNITS = {"total_baggages": "bags", "nonfree_baggages": "bags", "amount": "dollars"}


def _counts(action: Action) -> list[str]:
    return [k for k in _UNITS if k in action.arguments]


def with_unit(action: Action) -> Action:
    """`action` with its first count or amount written as text with its unit: 3 → '3 bags'."""
    name = _counts(action)[0]
    return Action(name=action.name, arguments={**action.arguments, name: f"{action.arguments[name]} {_UNITS[name]}"})


def corrupt_action(action: Action, task: AirlineTask, rng: random.Random) -> Action:
    """`action` with one argument corrupted (a typo in an id that exists nowhere, or a wrong JSON type)."""
    args = {k: (list(v) if isinstance(v, list) else v) for k, v in action.arguments.items()}
    options: list[str] = [k for k in ("reservation_id", "payment_id", "user_id") if k in args]
    options += [k for k in ("total_baggages", "nonfree_baggages", "amount") if k in args]
    if "flights" in args:
        options += ["flight_number", "flights"]
    choice = rng.choice(options)
    known = set(task.db.reservations) | set(task.db.users) | {f.flight_number for f in task.db.flights.values()}
    known |= {p.payment_id for u in task.db.users.values() for p in u.payment_methods}
    if choice in ("reservation_id", "payment_id", "user_id"):
        args[choice] = _typo(args[choice], known, rng)
    elif choice in _UNITS:
        args[choice] = f"{args[choice]} {_UNITS[choice]}"
    elif choice == "flight_number":
        first = dict(args["flights"][0])
        first["flight_number"] = _typo(first["flight_number"], known, rng)
        args["flights"] = [first, *args["flights"][1:]]
    else:
        args["flights"] = [f["flight_number"] for f in args["flights"]]
    return Action(name=action.name, arguments=args)


def _typo(value: str, known: set[str], rng: random.Random) -> str:
    """Change one digit or capital of `value` (a lowercase letter if it has neither), to the same kind
    of character, so that it names nothing known."""
    positions = [i for i, c in enumerate(value) if c.isdigit() or c.isupper()] or [
        i for i, c in enumerate(value) if c.islower()]
    while True:
        i = rng.choice(positions)
        pool = string.digits if value[i].isdigit() else string.ascii_uppercase if value[i].isupper() else string.ascii_lowercase
        new = value[:i] + rng.choice(pool.replace(value[i], "")) + value[i + 1:]
        if new not in known:
            return new


def scripted_policy_from_spec(spec: str, seed: int = 0, rule_check: bool = False, cite_values: bool = False,
                              **_: Any) -> ScriptedAirlinePolicy:
    """'oracle' or 'flawed' / 'flawed:p1[,p2[,p3[,p4]]]' (missing rates are 0; bare 'flawed' = 0.25 each);
    a rate may name the sub-task kind it is scoped to: 'flawed:1@cancel,1,1@change,1@bags'."""
    name, _, args = spec.partition(":")
    if name == "oracle":
        if args:
            raise ValueError("'oracle' takes no parameters")
        return ScriptedAirlinePolicy(seed=seed, rule_check=rule_check, cite_values=cite_values)
    if name != "flawed":
        raise ValueError("not a reference policy of the airline domain (oracle, flawed, flawed:p1[,p2[,p3[,p4]]])")
    if not args:
        return ScriptedAirlinePolicy(DEFAULT_FLAWED_RATES, seed=seed, rule_check=rule_check, cite_values=cite_values)
    parts = [p.partition("@") for p in args.split(",")]
    if len(parts) > len(FAULTS):
        raise ValueError(f"'flawed' takes at most {len(FAULTS)} rates (p1..p4), got {len(parts)}")
    try:
        rates = [float(p) for p, _, _ in parts]
    except ValueError:
        raise ValueError(f"'flawed' rates must be numbers, got '{args}'") from None
    scopes: list[str | None] = [kind or None for _, _, kind in parts]
    for i, kind in enumerate(scopes, start=1):
        if kind is not None and (kind not in SUBTASK_KINDS or i == 2):
            where = "p2 (stop early) takes no scope" if i == 2 else f"a scope is one of {', '.join(SUBTASK_KINDS)}"
            raise ValueError(f"'flawed' p{i} scope '{kind}': {where}")
    for i, p in enumerate(rates, start=1):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"'flawed' rate p{i} = {p:g} is outside [0, 1]")
    rates += [0.0] * (len(FAULTS) - len(rates))
    scopes += [None] * (len(FAULTS) - len(scopes))
    return ScriptedAirlinePolicy((rates[0], rates[1], rates[2], rates[3]), seed=seed, scopes=tuple(scopes),
                                 rule_check=rule_check, cite_values=cite_values)


DEFAULT_FLAWED_RATES = (0.25, 0.25, 0.25, 0.25)
