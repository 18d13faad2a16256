"""SWE-RL's reward against hand-computed values."""

import pytest

from tracerl.envs.code.swe_rl import PatchError, normalised_diffs, patch_similarity, similarity

GOLD = "diff --git a/f.py b/f.py\nindex 1..2 100644\n--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n-a\n+b\n"


def test_normalised_diff_keeps_the_changed_lines_only():
    assert normalised_diffs(GOLD) == {"f.py": "-a\n+b"}
    moved = "--- a/f.py\t2024-01-01\n+++ b/f.py\n@@ -40,2 +41,2 @@\n ctx   \n-a\n+b\n"
    assert normalised_diffs(moved) == {"f.py": " ctx\n-a\n+b"}  # line numbers, timestamps, trailing spaces dropped


def test_similarity_is_two_m_over_t():
    # "-a\n+b" vs "-a\n+c": the longest match is "-a\n+" (4 characters): 2 * 4 / (5 + 5)
    assert similarity("-a\n+b", "-a\n+c") == pytest.approx(0.8)
    assert similarity("", "") == 1.0 and similarity("abc", "") == 0.0


def test_reward_cases():
    assert patch_similarity(GOLD, GOLD) == 1.0
    other = GOLD.replace("+b", "+c")
    assert patch_similarity(other, GOLD) == pytest.approx(0.8)
    extra = GOLD + "--- /dev/null\n+++ b/g.py\n@@ -0,0 +1 @@\n+x\n"
    assert patch_similarity(extra, GOLD) == pytest.approx(0.5)  # f.py 1.0, g.py 0.0: mean over the union
    assert patch_similarity(other + "--- /dev/null\n+++ b/g.py\n@@ -0,0 +1 @@\n+x\n", GOLD) == pytest.approx(0.4)
    assert patch_similarity("", GOLD) == 0.0  # the empty patch parses: no file matches
    assert patch_similarity("Fixed commit message\n" + GOLD, GOLD) == 1.0


@pytest.mark.parametrize("bad", [
    "I fixed it by changing b to a.",
    "--- a/f.py\n@@ -1 +1 @@\n-a\n+b\n",  # no +++ header
    "--- a/f.py\n+++ b/f.py\n@@ -1,2 +1 @@\n-a\n+b\n",  # the hunk promises two old lines
    "--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n*a\n+b\n",  # a line with no marker
    "--- a/f.py\n+++ b/f.py\n@@ one @@\n-a\n+b\n",
])
def test_unparsable_answers_get_minus_one(bad):
    with pytest.raises(PatchError):
        normalised_diffs(bad)
    assert patch_similarity(bad, GOLD) == -1.0
