"""Code-repair tasks generated from a seed, shaped as SWE-bench instances.

`generate_task(seed)` is a pure function of the seed. A task is a small Python package

    <pkg>/__init__.py        re-exports the public functions
    <pkg>/api.py             the public functions, each calling a helper
    <pkg>/<module>.py        the helpers, over one or two modules (a bug sits in one of them)
    <pkg>/<decoy>.py         an unused module holding copies of helpers under the same names
    tests/test_api.py        the repository's own tests (they pass before the fix)

with an issue written as a user reports it — the call they made, what it returned, what they
expected: the symptom, never the file or the helper — and, as SWE-bench defines them, hidden
FAIL_TO_PASS tests (`tests/test_issue.py`, added at grading time, failing before the fix and passing
after it) and PASS_TO_PASS tests (the repository's own tests). `gold_patch` is the fix as a unified
diff.

Each bug is an operator or name in one line of a helper (`BugTemplate`), with the right one, the
bug, and a *slip* — a plausible wrong fix that a test of the repository catches (so that running
the tests after an edit tells a slip from a fix). Every input in the tests and the issue is drawn
and then checked by running the generated code: the issue's call differs between bug and fix, the
repository's tests pass with the bug and with the fix, and one of them fails with the slip.

Task kinds: `single` (one bug) and `multi` (two bugs in two helpers, two symptoms in the issue —
multi-step completion). Difficulty grows with the seed's draw: one or two helper modules, one to
three public functions besides the buggy ones, a decoy module or none.
"""

from __future__ import annotations

import difflib
import random
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TRAIN_SEEDS = range(0, 100_000)
TEST_SEEDS = range(1_000_000, 1_100_000)
SPLITS: dict[str, range] = {"train": TRAIN_SEEDS, "test": TEST_SEEDS}
TaskKind = Literal["single", "multi"]
MULTI_SHARE = 0.35
ISSUE_TESTS = "tests/test_issue.py"
REPO_TESTS = "tests/test_api.py"
TEST_COMMAND = "python -m pytest -q"  # how the repository's tests are run (the README says so)


@dataclass(frozen=True)
class BugTemplate:
    """A helper whose marked line holds `{op}`: `right` makes it correct, `bug` wrong, `slip` a wrong fix."""

    key: str
    params: tuple[str, ...]
    body: str  # the helper's source; `{name}` its name, `{op}` the operator slot
    right: str
    bug: str
    slip: str
    names: tuple[str, ...]  # the helper's name, drawn
    public: tuple[str, ...]  # the public function's name, drawn
    doc: str  # what the public function does
    inputs: Callable[[random.Random], tuple[Any, ...]]


def _ints(rng: random.Random, n: int, low: int = 0, high: int = 9) -> list[int]:
    return [rng.randint(low, high) for _ in range(n)]


def _words(rng: random.Random) -> list[str]:
    pool = ["red", "Blue", " green", "TEAL ", "ochre", " Sand", "mint", "Plum ", "gold", "sky", "rose", "ash"]
    return rng.sample(pool, rng.randint(2, 3))


BUGS: tuple[BugTemplate, ...] = (
    BugTemplate(
        "count_at_least", ("values", "limit"),
        "def {name}(values, limit):\n    count = 0\n    for value in values:\n        if value {op} limit:\n"
        "            count += 1\n    return count\n",
        ">=", ">", "!=", ("count_at_least", "tally_reaching", "num_at_least"),
        ("count_passing", "passing_scores", "count_qualified"), "How many values reach the limit.",
        lambda rng: (_ints(rng, rng.randint(3, 5)), rng.randint(2, 7))),
    BugTemplate(
        "line_sum", ("items",),
        "def {name}(items):\n    total = 0\n    for quantity, price in items:\n        total += quantity {op} price\n"
        "    return total\n",
        "*", "+", "//", ("line_sum", "sum_lines", "items_total"),
        ("order_total", "basket_total", "invoice_total"), "The total price of (quantity, price) lines.",
        lambda rng: ([(rng.randint(0, 4), rng.randint(1, 6)) for _ in range(rng.randint(1, 3))],)),
    BugTemplate(
        "window", ("values", "start", "stop"),
        "def {name}(values, start, stop):\n    picked = []\n    for index, value in enumerate(values):\n"
        "        if start <= index {op} stop:\n            picked.append(value)\n    return picked\n",
        "<", "<=", ">", ("window", "slice_between", "take_range"),
        ("page_items", "visible_rows", "select_span"), "The values from index start up to, not including, stop.",
        lambda rng: (_ints(rng, rng.randint(4, 6)), rng.randint(0, 2), rng.randint(2, 7))),
    BugTemplate(
        "discount", ("price", "percent"),
        "def {name}(price, percent):\n    factor = (100 {op} percent) / 100\n    return round(price * factor, 2)\n",
        "-", "+", "*", ("discount", "apply_discount", "reduced_price"),
        ("sale_price", "price_after_discount", "discounted"), "The price less a percentage discount.",
        lambda rng: (rng.choice([10, 20, 40, 80, 120]), rng.choice([0, 0, 10, 25, 50]))),
    BugTemplate(
        "clamp", ("value", "low", "high"),
        "def {name}(value, low, high):\n    capped = {op}(value, high)\n    return max(low, capped)\n",
        "min", "max", "pow", ("clamp", "bound", "limit_to"),
        ("bounded_level", "clamp_volume", "safe_setting"), "The value kept between low and high.",
        lambda rng: (rng.randint(0, 12), rng.randint(0, 3), rng.choice([2, 4, 6, 8, 10]))),
    BugTemplate(
        "tidy_join", ("words", "sep"),
        "def {name}(words, sep):\n    cleaned = [word.{op}() for word in words]\n    return sep.join(cleaned)\n",
        "strip", "lower", "upper", ("tidy_join", "join_clean", "neat_join"),
        ("label_text", "tag_line", "joined_names"), "The words, stripped of surrounding spaces, joined by sep.",
        lambda rng: (_words(rng), rng.choice([", ", "-", " "]))),
)
BUG_KEYS = tuple(b.key for b in BUGS)

PACKAGES = ("shopkit", "ledger", "inventory", "tallyho", "scoreboard", "textkit", "gridlib", "planner")
MODULES = ("utils", "helpers", "compute", "core_ops", "calc", "rules")
DECOYS = ("legacy", "compat", "old_utils", "v1")
OPENINGS = (
    "I ran into a wrong result.",
    "Something is off with {pkg}.",
    "Bug report for {pkg}.",
    "Hi, I think I found a bug.",
)


class Bug(BaseModel):
    """One planted bug: where it is, the line as it is, as it should be, and the slip."""

    model_config = ConfigDict(extra="forbid")

    template: str
    path: str  # the helper's module
    helper: str
    public: str  # the public function that shows it
    line: str  # the buggy line, as in the file
    fixed: str  # the line fixed
    slipped: str  # the line after the slip (a wrong fix the repository's tests catch)
    call: str  # the issue's call, e.g. "order_total([(2, 3)])"
    got: str  # repr of what the call returns with the bug
    expected: str  # … and after the fix


class CodeTask(BaseModel):
    """One task instance, as SWE-bench states one: repository, issue, tests, gold patch."""

    model_config = ConfigDict(extra="forbid")

    seed: int
    instance_id: str
    kind: TaskKind
    package: str
    files: dict[str, str]  # the repository before the fix
    problem_statement: str
    bugs: list[Bug]
    decoy: str | None  # the decoy module's path
    hidden_tests: dict[str, str]  # path -> text, added at grading time
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    gold_patch: str
    test_patch: str
    functions: dict[str, str] = Field(default_factory=dict)  # public function -> the module path of its helper

    def fixed_files(self, slip: set[int] = frozenset(), skip: set[int] = frozenset()) -> dict[str, str]:
        """The repository with every bug fixed (bug i slipped instead where i in `slip`, left where in `skip`)."""
        files = dict(self.files)
        for i, bug in enumerate(self.bugs):
            if i in skip:
                continue
            files[bug.path] = files[bug.path].replace(bug.line, bug.slipped if i in slip else bug.fixed, 1)
        return files

    def info(self) -> dict[str, Any]:
        """The public task facts a trajectory keeps (info of reset)."""
        return {"task_id": self.instance_id, "task_kind": self.kind, "instance_id": self.instance_id,
                "FAIL_TO_PASS": list(self.fail_to_pass), "PASS_TO_PASS": list(self.pass_to_pass),
                "gold_patch": self.gold_patch, "gold_files": sorted({b.path for b in self.bugs}),
                "gold_functions": sorted({b.helper for b in self.bugs})}


def task_seeds(split: str, n: int, offset: int = 0) -> list[int]:
    """The first `n` task seeds of a split (after `offset`): a fixed, reproducible task set."""
    seeds = SPLITS[split]
    if offset < 0 or n < 0 or offset + n > len(seeds):
        raise ValueError(f"split '{split}' has {len(seeds)} tasks; asked for {n} from offset {offset}")
    return list(seeds[offset:offset + n])


def unified_diff(before: dict[str, str], after: dict[str, str]) -> str:
    """A git-style unified diff (3 lines of context) from `before` to `after`, files in path order."""
    parts = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        a = f"a/{path}" if old is not None else "/dev/null"
        b = f"b/{path}" if new is not None else "/dev/null"
        header = f"diff --git a/{path} b/{path}\n"
        if old is None:
            header += "new file mode 100644\n"
        elif new is None:
            header += "deleted file mode 100644\n"
        body = difflib.unified_diff((old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
                                    fromfile=a, tofile=b, n=3)
        text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in body)
        parts.append(header + text)
    return "".join(parts)


def _run(source: str, name: str, args: tuple[Any, ...]) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<helper>", "exec"), namespace)  # our own generated code, never an agent's
    try:
        return namespace[name](*[_copy(a) for a in args])
    except Exception as e:  # a slip may raise (pow of a negative number, …): a result like any other
        return f"<{type(e).__name__}>"


def _copy(value: Any) -> Any:
    return [_copy(v) for v in value] if isinstance(value, list) else value


def _call_text(name: str, args: tuple[Any, ...]) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


@dataclass
class _Helper:
    template: BugTemplate
    name: str
    public: str
    module: str
    buggy: bool

    def source(self, op: str) -> str:
        return self.template.body.format(name=self.name, op=op)

    def line(self, op: str) -> str:
        return next(line for line in self.source(op).splitlines() if op in line and "def " not in line)


def _draw_inputs(h: _Helper, rng: random.Random) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """(issue call's args, a repository test's args): the issue's shows the bug; the test's passes with
    the bug and the fix and fails with the slip. None when 200 draws find no such pair."""
    t = h.template
    right, bug, slip = h.source(t.right), h.source(t.bug), h.source(t.slip)
    issue = test = None
    for _ in range(200):
        args = t.inputs(rng)
        r, b, s = (_run(src, h.name, args) for src in (right, bug, slip))
        if issue is None and r != b and isinstance(r, (int, float, str, list)) and not str(r).startswith("<"):
            issue = args
        elif test is None and r == b and s != r:
            test = args
        if issue is not None and test is not None:
            return issue, test
    return None


@dataclass(frozen=True)
class TaskShape:
    """What a capability environment fixes of a task (None: drawn as the target draws it)."""

    salt: str = ""  # seeds a different task family (a capability environment's own tasks)
    kind: TaskKind | None = None
    modules: int | None = None  # helper modules, 1-2
    decoy: bool | None = None
    clean: int | None = None  # helpers without a bug, 1-3
    suggest_slip: bool = False  # the issue suggests the slip as the fix ("maybe `!=` is meant?")


def generate_task(seed: int, shape: TaskShape = TaskShape()) -> CodeTask:
    """The task of `seed` (see the module docstring); `shape` fixes parts of it (capability environments)."""
    rng = random.Random(f"tracerl-code-{shape.salt + '-' if shape.salt else ''}{int(seed)}")
    draw = rng.random() < MULTI_SHARE
    kind: TaskKind = shape.kind or ("multi" if draw else "single")
    package = rng.choice(PACKAGES)
    modules = rng.sample(MODULES, shape.modules or rng.choice([1, 2]))
    draw = rng.random() < 0.75
    decoy = rng.choice(DECOYS) if (draw if shape.decoy is None else shape.decoy) else None
    n_bugs = 2 if kind == "multi" else 1
    n_clean = shape.clean if shape.clean is not None else rng.randint(1, 3)
    templates = rng.sample(BUGS, n_bugs + n_clean)
    helpers: list[_Helper] = []
    used_public: set[str] = set()
    for i, t in enumerate(templates):
        public = rng.choice([p for p in t.public if p not in used_public])
        used_public.add(public)
        helpers.append(_Helper(t, rng.choice(t.names), public, modules[i % len(modules)], buggy=i < n_bugs))
    order = list(range(len(helpers)))
    rng.shuffle(order)
    helpers = [helpers[i] for i in order]

    drawn = {}
    for h in helpers:
        pair = _draw_inputs(h, rng)
        if pair is None:
            raise RuntimeError(f"no inputs for template {h.template.key} (seed {seed})")
        drawn[h.name] = pair

    files: dict[str, str] = {}
    pkg = package
    for module in modules:
        own = [h for h in helpers if h.module == module]
        files[f"{pkg}/{module}.py"] = f'"""Helpers of {pkg}."""\n\n\n' + "\n\n".join(
            h.source(h.template.bug if h.buggy else h.template.right) for h in own)
    if decoy is not None:  # the same helpers, unused: edits here change nothing the package runs
        copies = [h for h in helpers if h.buggy] + [h for h in helpers if not h.buggy][:1]
        files[f"{pkg}/{decoy}.py"] = f'"""Old versions of helpers, kept for reference; not used by {pkg}."""\n\n\n' + \
            "\n\n".join(h.source(h.template.bug) for h in copies)
    imports = "".join(f"from .{module} import {', '.join(sorted(h.name for h in helpers if h.module == module))}\n"
                      for module in modules)
    api = [f'"""The public functions of {pkg}."""\n\n{imports}']
    for h in helpers:
        params = ", ".join(h.template.params)
        api.append(f'\n\ndef {h.public}({params}):\n    """{h.template.doc}"""\n    return {h.name}({params})\n')
    files[f"{pkg}/api.py"] = "".join(api)
    files[f"{pkg}/__init__.py"] = f'"""{pkg}: a small package."""\n\nfrom .api import {", ".join(sorted(h.public for h in helpers))}\n'
    files["README.md"] = f"# {pkg}\n\nRun the tests with `{TEST_COMMAND}`.\n"

    tests = [f"from {pkg} import {', '.join(sorted(h.public for h in helpers))}\n"]
    p2p = []
    for h in helpers:
        args = drawn[h.name][1]
        expected = _run(h.source(h.template.right), h.name, args)
        tests.append(f"\n\ndef test_{h.public}():\n    assert {_call_text(h.public, args)} == {expected!r}\n")
        p2p.append(f"{REPO_TESTS}::test_{h.public}")
    files[REPO_TESTS] = "".join(tests)

    bugs, f2p, hidden, symptoms = [], [], [f"from {pkg} import {', '.join(sorted(h.public for h in helpers if h.buggy))}\n"], []
    for h in (h for h in helpers if h.buggy):
        args = drawn[h.name][0]
        t = h.template
        got, want = _run(h.source(t.bug), h.name, args), _run(h.source(t.right), h.name, args)
        call = _call_text(h.public, args)
        bugs.append(Bug(template=t.key, path=f"{pkg}/{h.module}.py", helper=h.name, public=h.public,
                        line=h.line(t.bug), fixed=h.line(t.right), slipped=h.line(t.slip), call=call,
                        got=repr(got), expected=repr(want)))
        hidden.append(f"\n\ndef test_{h.public}_issue():\n    assert {call} == {want!r}\n")
        f2p.append(f"{ISSUE_TESTS}::test_{h.public}_issue")
        symptoms.append(f"`{call}` returns `{got!r}`, but it should return `{want!r}`.")
    opening = rng.choice(OPENINGS).format(pkg=pkg)
    if len(symptoms) == 1:
        statement = f"{opening} Calling {symptoms[0]}"
    else:
        statement = f"{opening} Two things: calling {symptoms[0]} And calling {symptoms[1]}"
    statement += f" ({rng.choice(['Python 3.12', 'latest main', 'version 0.3'])})"
    if shape.suggest_slip:  # a user's guess at the fix: the slip, which the repository's tests catch
        guess = bugs[0].slipped.strip()
        statement += f" Maybe the code should read `{guess}`?"

    task = CodeTask(seed=int(seed), instance_id=f"{pkg}__{pkg}-{int(seed)}", kind=kind, package=pkg, files=files,
                    problem_statement=statement, bugs=bugs, decoy=None if decoy is None else f"{pkg}/{decoy}.py",
                    hidden_tests={ISSUE_TESTS: "".join(hidden)}, fail_to_pass=f2p, pass_to_pass=p2p,
                    gold_patch="", test_patch=unified_diff({}, {ISSUE_TESTS: "".join(hidden)}),
                    functions={h.public: f"{pkg}/{h.module}.py" for h in helpers})
    task.gold_patch = unified_diff(task.files, task.fixed_files())
    return task

