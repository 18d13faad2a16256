"""The code domain: tasks, tools, sandbox, grading, reference policies."""

import collections
import re

import pytest

from tracerl.core.messages import Message, ToolCall
from tracerl.envs.code import CodeEnv, generate_task
from tracerl.envs.code.grading import grade
from tracerl.envs.code.reference import FAULTS
from tracerl.envs.code.sandbox import ShellLimits, isolation, run_in_copy
from tracerl.envs.code.tasks import BUGS, ISSUE_TESTS, REPO_TESTS, unified_diff
from tracerl.envs.registry import make_env
from tracerl.envs.runner import Episode, rollout
from tracerl.envs.synthetic.checks import validate_env
from tracerl.models import factory

needs_sandbox = pytest.mark.skipif(len(isolation()) < 2, reason="no user namespaces or Landlock on this kernel")


def make_policy(spec, **options):
    """A policy by spec, the code domain's reference policies included."""
    return factory.make_policy(spec, make_env=lambda: make_env("code"), **options)


def call(name, **arguments):
    return Message.assistant(tool_calls=[ToolCall.make(name, arguments, "c1")])


def test_tasks_are_seeded_and_state_symptoms_not_locations():
    a, b = generate_task(11), generate_task(11)
    assert a == b and generate_task(12) != a
    kinds = collections.Counter(generate_task(s).kind for s in range(200))
    assert 40 < kinds["multi"] < 110 and kinds["single"] > 90
    used = collections.Counter(bug.template for s in range(200) for bug in generate_task(s).bugs)
    assert set(used) == {b.key for b in BUGS}
    for seed in range(50):
        task = generate_task(seed)
        for bug in task.bugs:  # the issue names the public call, never the helper or its module
            assert bug.call in task.problem_statement
            assert not re.search(rf"\b{bug.helper}\b", task.problem_statement) and bug.path not in task.problem_statement
            assert task.files[bug.path].count(bug.line) == 1
        assert ISSUE_TESTS not in task.files and len(task.fail_to_pass) == len(task.bugs)
        assert task.pass_to_pass and all(t.startswith(REPO_TESTS + "::") for t in task.pass_to_pass)


def test_unified_diff_is_gits_shape():
    diff = unified_diff({"p/a.py": "x = 1\ny = 2\n"}, {"p/a.py": "x = 1\ny = 3\n", "p/b.py": "z\n"})
    assert diff == ("diff --git a/p/a.py b/p/a.py\n--- a/p/a.py\n+++ b/p/a.py\n@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n+y = 3\n"
                    "diff --git a/p/b.py b/p/b.py\nnew file mode 100644\n--- /dev/null\n+++ b/p/b.py\n@@ -0,0 +1 @@\n+z\n")


def test_editor_view_replace_insert_create_and_errors():
    env = CodeEnv()
    env.reset(seed=3)
    task = env.task
    bug = task.bugs[0]
    out, *_ = env.step(call("str_replace_editor", command="view", path=bug.path))
    assert out[0].content.startswith(f"Here's the result of running `cat -n` on {bug.path}:\n     1\t")
    out, *_ = env.step(call("str_replace_editor", command="view", path="/repo/" + task.package))
    assert f"{task.package}/api.py" in out[0].content
    out, *_ = env.step(call("str_replace_editor", command="str_replace", path=bug.path, old_str="no such text", new_str="x"))
    assert out[0].content.startswith("Error: No replacement was performed, old_str `no such text` did not appear verbatim")
    out, *_ = env.step(call("str_replace_editor", command="str_replace", path=bug.path, old_str=bug.line.strip(),
                            new_str=bug.fixed.strip()))
    assert out[0].content.startswith(f"The file {bug.path} has been edited.") and bug.fixed.strip() in out[0].content
    out, *_ = env.step(call("str_replace_editor", command="insert", path=bug.path, insert_line=0, new_str="# fixed"))
    assert env._tools.files[bug.path].startswith("# fixed\n")
    out, *_ = env.step(call("str_replace_editor", command="create", path=bug.path, file_text="x"))
    assert "Cannot overwrite" in out[0].content
    out, *_ = env.step(call("str_replace_editor", command="view", path="../etc/passwd"))
    assert out[0].content == "Error: the path ../etc/passwd is outside the repository"
    out, *_ = env.step(call("search_dir", search_term=f"def {bug.helper}("))
    assert f"{bug.path}:" in out[0].content
    out, *_ = env.step(call("str_replace_editor", command="delete", path=bug.path))
    assert out[0].content.startswith("Error: invalid arguments for 'str_replace_editor': command")


@needs_sandbox
def test_shell_is_confined_to_the_copy(tmp_path):
    outside = tmp_path / "outside.txt"
    result = run_in_copy({"a.txt": "a\n"}, ["bash", "-c", f"echo x > {outside}; echo y > b.txt; echo z > $TMPDIR/t; "
                                            "python -c 'import socket; socket.create_connection((\"10.0.0.1\", 80), 2)'"])
    assert not outside.exists() and "Permission denied" in result.output
    assert result.files == {"a.txt": "a\n", "b.txt": "y\n"}
    assert "PermissionError" in result.output or "OSError" in result.output  # no connection leaves the sandbox
    slow = run_in_copy({}, ["bash", "-c", "sleep 30"], limits=ShellLimits(wall_seconds=1))
    assert slow.timed_out and "[killed: ran past 1 s]" in slow.output


@needs_sandbox
def test_grading_resets_tests_and_needs_both_test_sets():
    task = generate_task(5)
    original = {REPO_TESTS: task.files[REPO_TESTS]}
    args = (original, task.hidden_tests, task.fail_to_pass, task.pass_to_pass)
    assert not grade(task.files, *args).resolved
    assert grade(task.fixed_files(), *args).resolved
    slipped = grade(task.fixed_files(slip={0}), *args)
    assert not slipped.resolved and not all(slipped.pass_to_pass.values())  # the repository's tests catch a slip
    gamed = {**task.files, REPO_TESTS: "", ISSUE_TESTS: "def test_nothing():\n    pass\n"}
    assert not grade(gamed, *args).resolved  # the tests are put back before grading


@needs_sandbox
def test_oracle_solves_and_flawed_plants_every_fault():
    seeds = list(range(12))
    oracle = rollout(lambda: make_env("code"), make_policy("oracle"), [Episode(seed=s) for s in seeds])
    assert all(t.passed for t in oracle)
    assert all(t.info["model_patch"] == t.info["gold_patch"] for t in oracle)
    for i, fault in enumerate(FAULTS):
        rates = ["0"] * 4
        rates[i] = "1"
        played = rollout(lambda: make_env("code"), make_policy("flawed:" + ",".join(rates)), [Episode(seed=s) for s in seeds])
        planted = [t for t in played if fault in t.info["faults"]["planted"]]
        assert planted and not any(t.passed for t in planted), fault
        assert all(t.passed for t in played if not t.info["faults"]["planted"])


@needs_sandbox
def test_validates_as_an_environment():
    env = CodeEnv()
    report = validate_env(lambda: CodeEnv(), env.tools, seeds=range(4))
    assert report.passed, report.failures()


def test_swe_rl_reward_option_scores_the_diff():
    env = CodeEnv(reward="swe_rl")
    env.reset(seed=3)
    bug = env.task.bugs[0]
    env.step(call("str_replace_editor", command="str_replace", path=bug.path, old_str=bug.line.strip(), new_str=bug.fixed.strip()))
    _, reward, terminated, _, info = env.step(call("submit"))
    assert terminated and reward == 1.0 and info["trajectory_info"]["model_patch"] == env.task.gold_patch


@needs_sandbox
def test_pytest_in_the_fork_server_prints_what_python_m_pytest_prints():
    from tracerl.envs.code.sandbox import pytest_arguments, run_pytest, without_durations

    task = generate_task(5)
    files = task.fixed_files(slip={0})  # one test fails
    args = ["-q", "-p", "no:cacheprovider"]
    forked = run_pytest(files, args)
    launched = run_in_copy(files, ["python", "-m", "pytest", *args])
    assert forked.returncode == launched.returncode == 1
    assert without_durations(forked.output) == without_durations(launched.output)
    assert pytest_arguments("python -m pytest -q tests/test_api.py") == ["-q", "tests/test_api.py"]
    assert pytest_arguments("python -m pytest -q && rm -rf x") is None and pytest_arguments("pytest") is None
