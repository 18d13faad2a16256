"""Build the embedded tiny agent: tokenizer + supervised fine-tuning on a domain's flawed teacher.

    tracerl build-agent --recipe src/tracerl/models/tiny_agent/build.json --out DIR

The recipe (`AgentRecipe`) is the one source of a build: a JSON file, either a recipe or a build.json
whose `recipe` it takes — the shipped agent's build.json rebuilds the shipped agent. The builder
reaches its domain (`domain`: "airline" or "code") through the domain's teacher only
(`tracerl.envs.teacher.Teacher`, from `tracerl.envs.registry.make_teacher`).

1. Roll the domain's *flawed* teacher policy out on `episodes` train-split tasks (the split's first
   seeds): demonstrations with planted capability gaps.
2. Train a byte-level BPE tokenizer on the templated conversations (`tracerl.models.tokenizer`).
3. Build a Qwen3ForCausalLM from a config (random init, seeded) and train it on the
   demonstrations: next-token loss on the assistant tokens only (mask 1 of the exact token
   records; system, user and tool tokens are context), AdamW, linear warm-up then cosine decay.
   The first `drill_steps` steps train on *copy drills* only — and more of them, 50 at a time,
   while fewer than `drill_target` of the held-out id-read drills are copied exactly (see
   `exact_final_turns`), or of the values the user gave in answer to a question (see
   `answered_value_examples`) — then every `drill_every`-th step is a drill batch (see `copy_drills`).
4. Evaluate greedily on held-out test-split tasks and write `build.json` (recipe, command,
   data size, minutes, parameters, tokens/s, pass rates) beside the model.

Training (and the validation passes) run on `device` — a GPU buys longer training and larger
models than a 2-core machine does; the model is then saved and tested on the CPU, where the
embedded agent runs.

Why the drills: the first token of an id the agent must copy ("emma" of the user's
"emma_lopez_940") is found by a dedicated attention head, not by the induction heads that copy
the rest. Trained on whole episodes (a 631-token system prompt, one such token per episode) a
model of a million parameters had not formed that head after 2,000 steps and guessed a frequent
name; on short drills it forms within ~600 steps and then works with the system prompt too. The
step it forms at varies with the seed and the data (the shipped agent's by drill step 800; another
seed's not by 1,700), hence the drill check (docs/embedded-agent.md, "How it is built"). The
values a user gives in answer to the agent's question (a payment id, a date) are copied from the
message right before, yet formed later (the shipped agent's at 1,350; a build whose check did not
wait for them wrote half of its payment ids at chance), so the check waits for them too.

Faults drawn with probability above 1/2 become the student's greedy behaviour (recurring gaps);
those below 1/2 mostly wash out under greedy decoding, leaving the student's own errors. A fault
scoped to one kind of request with rate 1 (`flawed:1@cancel,…`) is a recurring gap tied to a
visible situation instead.
"""

from __future__ import annotations

import copy
import json
import math
import platform
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tracerl.core.errors import InputError
from tracerl.core.io import describe_validation_error, write_json
from tracerl.core.messages import Message, ToolCall
from tracerl.core.policy import Session
from tracerl.core.trajectory import Trajectory
from tracerl.envs.registry import make_teacher
from tracerl.envs.runner import Episode, rollout
from tracerl.envs.teacher import Teacher
from tracerl.models.chat import ChatFormat
from tracerl.models.generation import _forward_signature, shared_prefix_length
from tracerl.models.local import LocalPolicy
from tracerl.models.templates import TINY_AGENT_TEMPLATE
from tracerl.models.tiny import count_parameters, tiny_qwen3, tiny_qwen3_config
from tracerl.models.tokenizer import MAX_NUMBER_DIGITS, train_tokenizer

DRILL_GATES = ("id_reads_exact", "answered_values_exact")  # the drill check's rates that must reach `drill_target`


class AgentRecipe(BaseModel):
    """Everything `build-agent` needs, in one place: a recipe file (or a build.json's `recipe`) gives
    these fields; those it leaves out keep these defaults. The shipped agent's recipe is in its build.json."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    domain: str = "airline"  # whose teacher plays the demonstrations (tracerl.envs.registry.make_teacher)
    policy: str = "flawed:0.6,0.6,0.2,0.2"  # the teacher: the domain's flawed policy (airline: p1 skip precondition,
    # p2 stop early, p3 mis-pick, p4 corrupt argument; a rate may be scoped to a request kind, 1@cancel)
    episodes: int = Field(4000, ge=1)  # demonstrations: the train split's first seeds
    rule_check: bool = False  # the teacher says its rule check before deciding (airline, see tracerl.envs.reference)
    cite_values: bool = False  # … each answer after the values it reads (needs rule_check)
    hinted_share: float = Field(0.0, ge=0, le=1)  # demonstrations played with the domain's expert guidance, which the teacher follows
    vocab_size: int = Field(2048, ge=300)  # every id word one token, with or without its '_'
    number_digits: int = Field(3, ge=1, le=MAX_NUMBER_DIGITS)  # every run of 1-3 digits one token besides (see tokenizer.py)
    json_keys: bool = False  # a JSON key (`"amount": `) one pre-token, its value the next token (see tokenizer.py)
    hidden_size: int = Field(128, ge=4)
    num_hidden_layers: int = Field(4, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(384, ge=1)
    max_position_embeddings: int = 8192  # RoPE; room for τ²-bench retail's 4.4k-token opening (trained on shorter)
    tie_embeddings: bool = True  # the output layer is the input embedding (False: a separate one)
    max_steps: int = Field(1200, ge=1)
    drill_steps: int = Field(700, ge=0)  # copy drills only, before the episodes (0: no drills)
    drill_target: float = Field(0.95, ge=0, le=1)  # then more drill steps until the held-out id reads and answered values are this exact (0: no check)
    drill_extra_max: int = Field(1000, ge=0)  # at most this many more
    drill_every: int = Field(4, ge=0)  # after them, every N-th step is a drill batch (0: never)
    drill_batch_size: int = Field(24, ge=1)
    drill_max_tokens: int = Field(768, ge=1)  # longer drills are left out (a flight change's is ~650)
    drill_episodes: int = Field(4000, ge=0)  # conversations the drills come from (see `drill_conversations`)
    batch_size: int = Field(8, ge=1)
    learning_rate: float = Field(3e-3, gt=0)
    warmup_steps: int = Field(30, ge=1)
    weight_decay: float = Field(0.01, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(160, ge=1)
    eval_tasks: int = Field(48, ge=0)  # validation: train-split seeds after the training ones
    test_tasks: int = Field(100, ge=1)  # the report: test-split seeds
    num_threads: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> AgentRecipe:
        if self.cite_values and not self.rule_check:
            raise ValueError("cite_values needs rule_check: it changes how the rule check is said")
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads, and that of num_key_value_heads")
        return self

    def teacher(self) -> Teacher:
        """The domain's teacher this recipe names (`tracerl.envs.teacher.Teacher`)."""
        return make_teacher(self.domain, self.policy, rule_check=self.rule_check, cite_values=self.cite_values)


def load_recipe(path: str | Path) -> AgentRecipe:
    """A recipe from a JSON file: the recipe itself, or a build.json (its `recipe`). Bad input: `InputError`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("no such file", path=str(path)) from None
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON ({e.msg})", path=str(path), line=e.lineno) from None
    if isinstance(data, dict) and isinstance(data.get("recipe"), dict):
        data = data["recipe"]
    if not isinstance(data, dict):
        raise InputError("a recipe is a JSON object (or a build.json with a 'recipe' object)", path=str(path))
    try:
        return AgentRecipe.model_validate(data)
    except ValidationError as e:
        raise InputError(f"recipe: {describe_validation_error(e)}", path=str(path)) from None


def sft_example(chat: ChatFormat, trajectory: Trajectory) -> tuple[list[int], list[int]]:
    """(ids, mask) of a demonstration, built exactly as a model's episode record is: each assistant
    turn is the tokenizer's encoding of the template's rendering of the message (mask 1)."""
    chat = _prefix_memo(chat)
    session = Session(messages=[], tools=trajectory.tools)
    index = 0
    messages = trajectory.messages
    while index < len(messages) and messages[index].role != "assistant":
        index += 1
    session.messages = list(messages[:index])
    while index < len(messages):
        reply = messages[index]
        chat.prepare(session)
        before = chat.render(session.messages, session.tools, add_generation_prompt=True)
        after = chat.render(session.messages + [reply], session.tools, add_generation_prompt=False)
        body = after[len(before):]
        body = body[: body.rindex(chat.end_of_turn) + len(chat.end_of_turn)]
        ids = chat.encode(body)
        chat.record(session, ids, [0.0] * len(ids))
        session.messages.append(reply)
        index += 1
        while index < len(messages) and messages[index].role != "assistant":
            session.messages.append(messages[index])
            index += 1
    assert session.tokens is not None
    return list(session.tokens.ids), list(session.tokens.mask)


def _prefix_memo(chat: ChatFormat) -> ChatFormat:
    """`chat` rendering each prefix of one conversation once: every list `sft_example` renders is a
    prefix of the same messages with the same tools, so (length, generation prompt) names it, and
    each prefix is rendered twice otherwise (by `prepare` and for the turn's body) — half the
    templating of a build."""
    memo = copy.copy(chat)
    rendered: dict[tuple[int, bool], str] = {}

    def render(messages, tools, add_generation_prompt):
        key = (len(messages), add_generation_prompt)
        if key not in rendered:
            rendered[key] = ChatFormat.render(chat, messages, tools, add_generation_prompt)
        return rendered[key]

    memo.render = render
    return memo


def copy_drills(trajectory: Trajectory) -> list[Trajectory]:
    """Short copies of a demonstration, each ending with an assistant turn that copies a value.

    A turn copies a value when it writes one (`copied_values`: an id, airport, date, amount or
    flight number, in a call or in a text such as "… to flight HAT964 on 2024-05-20 …") that an earlier user
    or tool message holds as a whole word (a text that cites words only, as a compensation check's
    "silver or gold (gold) yes", is not drilled). The drill runs from the latest user message at or before every copied value's source (see
    `_source`) up to that turn, without the system prompt and tool list: a few hundred tokens, so
    the copy is easy to learn, and a write late in an episode is drilled from the request it serves.
    (Drills from one user message further back as well, so that the value sits at varying distances
    from the start, kept the reservation id's first word from being learnt: 2 of 40 teacher-forced,
    2026-12-03 at f982bdb.)
    """
    drills = []
    messages = trajectory.messages
    for index, message in enumerate(messages):
        if message.role != "assistant":
            continue
        values = copied_values(message)
        sources = [i for key, value in values if (i := _source(messages[:index], key, value)) is not None]
        if not sources:
            continue
        start = max(i for i in range(min(sources) + 1) if messages[i].role == "user")
        drills.append(trajectory.model_copy(update={"messages": messages[start: index + 1], "tools": []}))
    return drills


def copied_values(message: Message) -> list[tuple[str | None, str]]:
    """(argument name or None, value as written) of what an assistant turn may have copied: its
    calls' string (3+ characters) and number (2+ digits) arguments, nested ones included, or the
    numbers (2+ digits) and codes of its text. A one-digit count is everywhere, so where it is
    found says nothing."""
    if not message.tool_calls:
        words = re.findall(r"[\w-]*\d[\w-]*|\b[A-Z]{3}\b", message.content or "")
        return [(None, word) for word in words if len(word) >= 2]
    values: list[tuple[str | None, str]] = []

    def walk(key: str | None, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(k, v)
        elif isinstance(value, list):
            for v in value:
                walk(key, v)
        elif isinstance(value, str) and len(value) >= 3 or isinstance(value, int) and not isinstance(value, bool) and value >= 10:
            values.append((key, str(value)))

    for call in message.tool_calls:
        walk(None, call.parsed_arguments() or {})
    return values


def whole_word(value: str) -> re.Pattern[str]:
    """`value` as a whole word: not inside a longer id or word ("owl" is not in "owl_pine")."""
    return re.compile(rf"(?<![\w-]){re.escape(value)}(?![\w-])")


def _source(before: list[Message], name: str | None, value: str) -> int | None:
    """Where `value` was read: the latest user message that says it or tool result that gives it
    under the same key (`"reservation_id": "owl_pine"`), else (a value only listed among others, as
    a user's payment methods are) the latest user or tool message holding it as a whole word."""
    word = whole_word(value)
    holders = [i for i, m in enumerate(before) if m.role in ("user", "tool") and word.search(m.content or "")]
    keyed = (f'"{name}": "{value}"', f'"{name}": {value}') if name else ()
    named = [i for i in holders if before[i].role == "user" or any(k in (before[i].content or "") for k in keyed)]
    return (named or holders or [None])[-1]


def id_read_drills(drills: list[Trajectory], kinds: dict[str, str]) -> list[Trajectory]:
    """The drills that end with id reads — read calls whose every argument is an id
    (`get_reservation_details(reservation_id)`, `get_user_details(user_id)`): each needs only the
    lookup of ids, the skill whose formation is all-or-nothing from one build to the next. (A
    search's airports and date are left out: a build whose id lookup had formed copied 0 of 16.)
    `kinds`: each tool's kind, by name (the teacher's `tool_kinds()`)."""

    def id_read(call: ToolCall) -> bool:
        arguments = call.parsed_arguments() or {}
        return kinds.get(call.function.name) == "read" and bool(arguments) and all(k.endswith("_id") for k in arguments)

    return [d for d in drills if d.messages[-1].tool_calls and all(id_read(c) for c in d.messages[-1].tool_calls)]


def said_value_drills(drills: list[Trajectory]) -> list[Trajectory]:
    """The drills that end with a text, not a call: it says values read in a tool result (a new
    flight's number and date), found by their key, not named by the user."""
    return [d for d in drills if not d.messages[-1].tool_calls]


def answered_value_examples(chat: ChatFormat, tokenizer: Any, drills: list[Trajectory],
                            kinds: dict[str, str]) -> list[tuple[list[int], list[int]]]:
    """One example per value a drill's final turn copies from the user message right before it —
    the user's answer to the agent's question (a payment method, a date) — whose mask marks only
    that value's tokens, cut after them (causal: what follows changes no prediction), so that
    `exact_final_turns` judges the value alone. The id reads, watched on their own, are left out."""
    reads = {id(d) for d in id_read_drills(drills, kinds)}
    examples = []
    for drill in drills:
        *_, answer, turn = drill.messages
        if id(drill) in reads or answer.role != "user":
            continue
        ids, mask = sft_example(chat, drill)
        start = final_turn_start(mask)
        for _, value in copied_values(turn):
            if not whole_word(value).search(answer.content or ""):
                continue
            span = tokenizer(value, add_special_tokens=False)["input_ids"]
            at = next((i for i in range(start, len(ids) - len(span) + 1) if ids[i:i + len(span)] == span), None)
            if at is not None:
                examples.append((ids[:at + len(span)], [0] * at + [1] * len(span)))
    return examples


def drill_kinds(drills: list[Trajectory], kinds: dict[str, str]) -> list[str]:
    """What each drill's final turn does: "id read", "said value", or the name of the tool it calls."""
    reads = {id(d) for d in id_read_drills(drills, kinds)}
    return ["id read" if id(d) in reads else d.messages[-1].tool_calls[0].function.name if d.messages[-1].tool_calls
            else "said value" for d in drills]


def final_turn_start(mask: list[int]) -> int:
    """Where an example's last assistant turn (its final run of mask-1 tokens) starts."""
    start = len(mask)
    while start > 0 and mask[start - 1]:
        start -= 1
    return start


@torch.no_grad()
def exact_final_turns(model: torch.nn.Module, examples: list[tuple[list[int], list[int]]], pad_id: int, batch_size: int = 16) -> float:
    """Share of `examples` whose last assistant turn (the final run of mask-1 tokens) the model
    predicts exactly, every token the argmax given the true tokens before it."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    exact = 0
    for k in range(0, len(examples), batch_size):
        batch = examples[k:k + batch_size]
        input_ids, _, attention = (x.to(device) for x in _collate(batch, pad_id))
        predicted = model(input_ids=input_ids, attention_mask=attention).logits.argmax(-1)
        for row, (ids, mask) in enumerate(batch):
            start = final_turn_start(mask)
            exact += predicted[row, start - 1:len(ids) - 1].tolist() == ids[start:]
    model.train(was_training)
    return exact / max(1, len(examples))


def drill_conversations(recipe: AgentRecipe, demos: list[Trajectory]) -> list[Trajectory]:
    """What the copy drills are cut from: the training demonstrations, then (when
    `recipe.drill_episodes` is larger) demonstrations on the train seeds after the validation ones,
    `recipe.drill_episodes` in all — more codes to copy than a small model can memorise one by one."""
    first = recipe.episodes + recipe.eval_tasks
    more = max(0, recipe.drill_episodes - len(demos))
    return demos + (collect_demonstrations(recipe, recipe.teacher().seeds("train", more, first)) if more else [])


def conversation_texts(chat: ChatFormat, trajectories: list[Trajectory]) -> list[str]:
    return [chat.render(t.messages, t.tools, add_generation_prompt=False) for t in trajectories]


def collect_demonstrations(recipe: AgentRecipe, seeds: range | list[int]) -> list[Trajectory]:
    """The recipe's teacher's episodes on train-split `seeds` (a `hinted_share` of them with the hint)."""
    return recipe.teacher().demonstrations(list(seeds), seed=recipe.seed, hinted_share=recipe.hinted_share)


def evaluate(model: Any, tokenizer: Any, teacher: Teacher, seeds: list[int], split: str, max_new_tokens: int,
             batch_size: int = 64) -> list[Trajectory]:
    """Greedy episodes of the model on the teacher's domain's tasks of `split`."""
    policy = LocalPolicy(model, tokenizer, temperature=0.0, max_new_tokens=max_new_tokens)
    return rollout(lambda: teacher.make_env(split), policy, [Episode(seed=s) for s in seeds], batch_size=batch_size)


def build_agent(
    out_dir: str | Path,
    recipe: AgentRecipe,
    *,
    command: str = "",
    device: str = "cpu",
    log: Callable[[str], None] = print,
    progress: Callable[[int, int, float], None] | None = None,
) -> dict[str, Any]:
    """Make the agent in `out_dir` (model, tokenizer, build.json); return the build report."""
    start = time.time()
    torch.set_num_threads(recipe.num_threads)
    out_dir = Path(out_dir)
    teacher = recipe.teacher()
    kinds = teacher.tool_kinds()
    train_seeds = teacher.seeds("train", recipe.episodes)
    val_seeds = teacher.seeds("train", recipe.eval_tasks, recipe.episodes)
    test_seeds = teacher.seeds("test", recipe.test_tasks)

    demos = collect_demonstrations(recipe, train_seeds)
    teacher_pass = sum(t.passed for t in demos) / len(demos)
    log(f"{len(demos)} demonstrations from {recipe.policy} (teacher pass rate {teacher_pass:.3f})")

    bootstrap = train_tokenizer(["x"], vocab_size=300, chat_template=TINY_AGENT_TEMPLATE)
    texts = conversation_texts(ChatFormat(bootstrap), demos)
    tokenizer = train_tokenizer(texts, vocab_size=recipe.vocab_size, chat_template=TINY_AGENT_TEMPLATE,
                                number_digits=recipe.number_digits, json_keys=recipe.json_keys)
    chat = ChatFormat(tokenizer)
    examples = [sft_example(chat, t) for t in demos]
    drills = []
    if recipe.drill_steps or recipe.drill_every:
        drills = [sft_example(chat, d) for t in drill_conversations(recipe, demos) for d in copy_drills(t)]
        drills = [e for e in drills if len(e[0]) <= recipe.drill_max_tokens]
    n_tokens = sum(len(ids) for ids, _ in examples)
    n_loss = sum(sum(mask) for _, mask in examples)
    log(f"tokenizer: {len(tokenizer)} tokens; data: {n_tokens} tokens, {n_loss} trained on; {len(drills)} copy drills")

    config = tiny_qwen3_config(
        len(tokenizer), hidden_size=recipe.hidden_size, num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads, num_key_value_heads=recipe.num_key_value_heads,
        intermediate_size=recipe.intermediate_size, max_position_embeddings=recipe.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=recipe.tie_embeddings,
    )
    model = tiny_qwen3(config, seed=recipe.seed).to(device)
    log(f"model: Qwen3ForCausalLM, {count_parameters(model)} parameters, training on {device}")

    probe = None
    if drills and recipe.drill_target:
        held_out = [copy_drills(t) for t in collect_demonstrations(recipe, val_seeds)]
        watched = {"id_reads_exact": [sft_example(chat, d) for ds in held_out for d in id_read_drills(ds, kinds)],
                   "answered_values_exact": [e for ds in held_out for e in answered_value_examples(chat, tokenizer, ds, kinds)],
                   "said_values_exact": [sft_example(chat, d) for ds in held_out for d in said_value_drills(ds)]}
        probe = lambda m: {name: exact_final_turns(m, examples, tokenizer.pad_token_id) for name, examples in watched.items()}  # noqa: E731
        log(f"drill check: {len(watched['id_reads_exact'])} id-read drills and {len(watched['answered_values_exact'])} "
            f"answered values of the validation seeds ({len(watched['said_values_exact'])} said-value drills watched)")
    history = train_sft(model, examples, recipe, tokenizer.pad_token_id, drills=drills, log=log, progress=progress, drill_check=probe,
                        on_eval=lambda m: _pass_rate(evaluate(m, tokenizer, teacher, val_seeds, "train",
                                                              recipe.max_new_tokens)))
    train_seconds = history["seconds"]
    model.to("cpu")

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)

    t0 = time.time()
    test = evaluate(model, tokenizer, teacher, test_seeds, "test", recipe.max_new_tokens)
    eval_seconds = time.time() - t0
    generated = sum(sum(t.tokens.mask) for t in test if t.tokens)
    report = {
        "command": command,
        "recipe": recipe.model_dump(),
        "data": {"episodes": len(demos), "teacher_pass_rate": round(teacher_pass, 4), "tokens": n_tokens, "trained_tokens": n_loss,
                 "copy_drills": len(drills)},
        "drill_checks": history["drill_checks"],
        "model": {"architecture": "Qwen3ForCausalLM", "parameters": count_parameters(model), "vocab_size": len(tokenizer)},
        "training": {"steps": history["steps"], "seconds": round(train_seconds, 1),
                     "tokens_per_second": round(history["tokens"] / max(train_seconds, 1e-9), 1),
                     "final_loss": history["losses"][-1] if history["losses"] else None, "validation": history["evals"]},
        "test": {"tasks": len(test), "greedy_pass_rate": _pass_rate(test), "split": "test", "seeds": [test_seeds[0], test_seeds[-1]],
                 "generated_tokens": generated, "sampling_tokens_per_second": round(generated / max(eval_seconds, 1e-9), 1)},
        "minutes": round((time.time() - start) / 60, 2),
        "machine": {"torch": torch.__version__, "threads": recipe.num_threads, "platform": platform.platform(),
                    "training_device": str(device)},
    }
    write_json(out_dir / "build.json", report)
    return report


def train_sft(
    model: torch.nn.Module,
    examples: list[tuple[list[int], list[int]]],
    recipe: AgentRecipe,
    pad_id: int,
    *,
    drills: list[tuple[list[int], list[int]]] = (),
    log: Callable[[str], None] = print,
    progress: Callable[[int, int, float], None] | None = None,
    on_eval: Callable[[torch.nn.Module], float] | None = None,
    drill_check: Callable[[torch.nn.Module], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Masked next-token training: `recipe.drill_steps` steps of drill batches, then (with
    `drill_check`, rates by name) 50 more at a time while any of its `DRILL_GATES` < `recipe.drill_target`, at most
    `recipe.drill_extra_max`, at the learning rate the drills ended with; then `recipe.max_steps`
    steps of episode batches of which every `recipe.drill_every`-th is a drill batch instead (when
    there are drills). Returns losses, validation pass rates, drill checks, steps, tokens seen and
    seconds."""
    rng = random.Random(recipe.seed)
    torch.manual_seed(recipe.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.learning_rate, betas=(0.9, 0.95),
    )

    drill_steps = recipe.drill_steps if drills else 0
    total = drill_steps + recipe.max_steps

    def lr_at(step: int) -> float:
        if step < recipe.warmup_steps:
            return (step + 1) / recipe.warmup_steps
        frac = (step - recipe.warmup_steps) / max(1, total - recipe.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    prefix_len = shared_prefix_length([ids for ids, _ in examples], minimum=0)  # the system prompt
    log(f"shared prompt prefix: {prefix_len} tokens (computed once per batch)")
    order: list[list[int]] = []
    drill_order: list[list[int]] = []
    losses: list[float] = []
    evals: list[dict[str, float]] = []
    checks: list[dict[str, float]] = []
    tokens = 0
    extra = 0  # drill steps the check added
    start = time.time()
    model.train()

    def train_step(drill: bool, lr_factor: float) -> None:
        nonlocal order, drill_order, tokens
        if drill:
            if not drill_order:
                drill_order = length_grouped_batches([len(ids) for ids, _ in drills], recipe.drill_batch_size, rng)
            loss, n_tokens = shared_prefix_loss(model, [drills[i] for i in drill_order.pop()], 0, pad_id)
        else:
            if not order:
                order = length_grouped_batches([len(ids) for ids, _ in examples], recipe.batch_size, rng)
            loss, n_tokens = shared_prefix_loss(model, [examples[i] for i in order.pop()], prefix_len, pad_id)
        for group in optimizer.param_groups:
            group["lr"] = recipe.learning_rate * lr_factor
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += n_tokens
        losses.append(round(float(loss.detach()), 4))
        done, planned = len(losses), total + extra
        if progress:
            progress(done, planned, losses[-1])
        if done % 25 == 0:
            log(f"step {done}/{planned} loss {sum(losses[-25:]) / 25:.4f} ({time.time() - start:.0f}s)")

    def check() -> float:
        rates = drill_check(model)
        checks.append({"step": len(losses), **{name: round(rate, 4) for name, rate in rates.items()}})
        log(f"step {len(losses)}: held-out drills " + ", ".join(f"{name} {rate:.3f}" for name, rate in rates.items()))
        return min(rates[name] for name in DRILL_GATES if name in rates)

    for scheduled in range(total):
        train_step(bool(drills) and is_drill_step(scheduled, drill_steps, recipe.drill_every), lr_at(scheduled))
        if drill_check and recipe.drill_target and scheduled + 1 == drill_steps:
            while check() < recipe.drill_target and extra < recipe.drill_extra_max:
                for _ in range(min(50, recipe.drill_extra_max - extra)):
                    extra += 1
                    train_step(True, lr_at(scheduled))
    seconds = time.time() - start
    if on_eval:
        evals.append({"step": len(losses), "validation_pass_rate": on_eval(model)})
        log(f"final validation greedy pass rate {evals[-1]['validation_pass_rate']:.3f}")
    model.eval()
    return {"losses": losses, "evals": evals, "drill_checks": checks, "steps": len(losses), "tokens": tokens, "seconds": seconds}


def is_drill_step(step: int, drill_steps: int, drill_every: int) -> bool:
    """Whether 0-based `step` trains on drills: all of the first `drill_steps`, then every `drill_every`-th."""
    return step < drill_steps or bool(drill_every and (step - drill_steps) % drill_every == drill_every - 1)


def length_grouped_batches(lengths: list[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """One epoch of batches: shuffled, then sorted by length within windows of 8 batches (less padding)."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * 8
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: lengths[i])
        batches += [chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def shared_prefix_loss(model: torch.nn.Module, batch: list[tuple[list[int], list[int]]], prefix_len: int, pad_id: int) -> tuple[torch.Tensor, int]:
    """Mean next-token loss on mask-1 tokens, computing the shared prefix (mask 0) once for the batch.

    The prefix runs with batch size 1; its KV cache is repeated for the rows and the rest of each
    sequence runs on top of it at positions prefix_len…. Equal to the plain loss (tested).
    Returns (loss, tokens processed).
    """
    device = next(model.parameters()).device
    if prefix_len == 0:
        input_ids, labels, attention = (t.to(device) for t in _collate(batch, pad_id))
        return model(input_ids=input_ids, attention_mask=attention, labels=labels).loss, int(attention.sum())
    cache_name, _ = _forward_signature(model)
    prefix = torch.tensor([batch[0][0][:prefix_len]], device=device)
    cache = getattr(model(input_ids=prefix, use_cache=True), cache_name)
    cache.batch_repeat_interleave(len(batch))
    rest = [(ids[prefix_len:], mask[prefix_len:]) for ids, mask in batch]
    input_ids, labels, attention = (t.to(device) for t in _collate(rest, pad_id))
    positions = torch.arange(prefix_len, prefix_len + input_ids.shape[1], device=device).expand(len(batch), -1)
    full_mask = torch.cat([torch.ones(len(batch), prefix_len, dtype=attention.dtype, device=device), attention], dim=1)
    out = model(input_ids=input_ids, attention_mask=full_mask, position_ids=positions, use_cache=True,
                labels=labels, **{cache_name: cache})
    return out.loss, prefix_len + int(attention.sum())


def _collate(batch: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, labels (−100 off the assistant tokens) and the attention mask."""
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, mask) in enumerate(batch):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids)
        attention[row, :n] = 1
        labels[row, :n] = torch.tensor([t if m else -100 for t, m in zip(ids, mask, strict=True)])
    return input_ids, labels, attention


def _pass_rate(trajectories: list[Trajectory]) -> float:
    return round(sum(t.passed for t in trajectories) / max(1, len(trajectories)), 4)

