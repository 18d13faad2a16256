"""Train a small Qwen3-style tokenizer with the `tokenizers` library (byte-level BPE).

Byte-level BPE covers every byte, so `decode(encode(text)) == text` for any text; the ChatML
markers and the tool-call tags are single added tokens, as in Qwen3's tokenizer.

The pre-tokenizer is Qwen2/Qwen3's split pattern, changed in how it cuts words and, optionally,
numbers. Unlike Qwen, a word does not absorb the space before it (" emma" is " " + "emma"), so an
id reads as the same tokens in prose ("my user id is emma_lopez_940") and in a tool call's
JSON (`"emma_lopez_940"`). A large model learns that " emma" and "emma" are the same name; a
model of a million parameters copies ids only when they are the same token sequence in both
places (measured: with Qwen's pattern the agent copied 1% of user ids exactly; with this one and
id drills, 87.5%). The price is ~25% more tokens on this domain's text.

Numbers: by default every digit is its own token, as in Qwen. With `number_digits=3` a number is
cut into runs of up to three digits from the left, as Llama 3's tokenizer does, and every run of one
to three digits is one token: an amount such as 437 is then one token of a thousand, which can be
copied by the lookup that copies an id word, where ten digit tokens recur everywhere and a copy of
the digits after the first has nothing to find its place by. (The shipped agent has this tokenizer
and still says no number it read in a tool result: docs/embedded-agent.md, "What it cannot do".)

JSON keys: with `json_keys`, a key with its colon, the space after it and a string's opening quote
is one pre-token (`"amount": `, `"reservation_id":"`), so that a value in a tool result is the token
right after its key's. Without it a value sits two or three tokens after its key word (`amount`,
`":`, ` `, `582`), where every value of every key has the same one or two tokens before it. Measured
(2026-12-03 at 5920521): with it the id-read lookup formed by drill step 700
in both build seeds (without, in one of two), and a value read by its key, such as the refund, is
still not said. The shipped agent has it (`--json-keys`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tracerl.models.templates import (
    END_OF_TURN,
    MARKUP_TOKENS,
    SPECIAL_TOKENS,
    TINY_AGENT_TEMPLATE,
)

# Qwen2/Qwen3 tokenizer.json's Split pattern, with `[^\r\n\p{L}\p{N}]?\p{L}+` (a word may take
# the space before it) narrowed to `[^\s\p{L}\p{N}]?\p{L}+` (it may take a "_" or quote, not a space).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\s\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


MAX_NUMBER_DIGITS = 3  # every run of up to this many digits may be one token: 10 + 100 + 1,000 ids

JSON_KEY = r'"[\p{L}_]+": ?"?'  # a key, its colon, an optional space and a string value's opening quote
PUNCTUATION = r" ?[^\s\p{L}\p{N}]+[\r\n]*"


def split_pattern(number_digits: int, json_keys: bool = False) -> str:
    """SPLIT_PATTERN with numbers cut into runs of up to `number_digits` digits and, with
    `json_keys`, a JSON key one pre-token (a run of punctuation stops before a key's quote)."""
    pattern = SPLIT_PATTERN if number_digits == 1 else SPLIT_PATTERN.replace(r"|\p{N}|", rf"|\p{{N}}{{1,{number_digits}}}|")
    if json_keys:
        pattern = JSON_KEY + "|" + pattern.replace(PUNCTUATION, rf" ?(?:(?!{JSON_KEY})[^\s\p{{L}}\p{{N}}])+[\r\n]*")
    return pattern


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 1024, chat_template: str = TINY_AGENT_TEMPLATE, number_digits: int = 1,
    json_keys: bool = False,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts`, wrapped for transformers, chat template set.

    Ids 0..8 are the special and markup tokens (`<|endoftext|>` = 0 is also the pad token), then
    the 256 byte symbols, then the merges. With `number_digits` > 1, every run of up to that many
    digits is one token besides: `vocab_size` plus up to 10**number_digits ids. With `json_keys` a
    JSON key is one pre-token (a frequent one becomes one token). Deterministic for the same texts
    and options.
    """
    if not 1 <= number_digits <= MAX_NUMBER_DIGITS:
        raise ValueError(f"number_digits must be 1, 2 or 3, not {number_digits}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_pattern(number_digits, json_keys)), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + MARKUP_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if number_digits > 1:
        tok = _with_number_tokens(tok, number_digits)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=END_OF_TURN,
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )
    wrapped.chat_template = chat_template
    return wrapped


def _with_number_tokens(tok: Tokenizer, number_digits: int) -> Tokenizer:
    """`tok` with every run of 2..`number_digits` digits one token: the merges the training learnt
    between digits are replaced by "ab" = "a" + "b", then "abc" = "a" + "bc" and "ab" + "c" (which
    pair merges first depends on their ranks). A number's pre-token holds digits only, so these
    merges never meet a letter's."""
    spec = json.loads(tok.to_str())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    merges = [m for m in merges if not (m[0].isdigit() and m[1].isdigit())]
    next_id = max(vocab.values()) + 1
    for length in range(2, number_digits + 1):
        for value in range(10 ** length):
            run = f"{value:0{length}d}"
            merges.extend([run[:k], run[k:]] for k in range(1, length))
            if run not in vocab:
                vocab[run], next_id = next_id, next_id + 1
    spec["model"]["merges"] = merges
    return Tokenizer.from_str(json.dumps(spec))
