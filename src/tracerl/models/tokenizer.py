"""Train a small Qwen3-style tokenizer with the `tokenizers` library (byte-level BPE).

Byte-level BPE covers every byte, so `decode(encode(text)) == text` for any text; the ChatML
markers and the tool-call tags are single added tokens, as in Qwen3's tokenizer.

The pre-tokenizer is Qwen2/Qwen3's split pattern with one change. As in Qwen, every digit is its
own token. Unlike Qwen, a word does not absorb the space before it (" emma" is " " + "emma"), so
an id reads as the same tokens in prose ("my user id is emma_lopez_940") and in a tool call's
JSON (`"emma_lopez_940"`). A large model learns that " emma" and "emma" are the same name; a
model of a million parameters copies ids only when they are the same token sequence in both
places (measured: with Qwen's pattern the agent copied 1% of user ids exactly; with this one and
id drills, 87.5%). The price is ~25% more tokens on this domain's text.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tracerl.models.templates import END_OF_TURN, MARKUP_TOKENS, SPECIAL_TOKENS, TINY_AGENT_TEMPLATE

# Qwen2/Qwen3 tokenizer.json's Split pattern, with `[^\r\n\p{L}\p{N}]?\p{L}+` (a word may take
# the space before it) narrowed to `[^\s\p{L}\p{N}]?\p{L}+` (it may take a "_" or quote, not a space).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\s\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 1024, chat_template: str = TINY_AGENT_TEMPLATE
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts`, wrapped for transformers, chat template set.

    Ids 0..8 are the special and markup tokens (`<|endoftext|>` = 0 is also the pad token), then
    the 256 byte symbols, then the merges. Deterministic for the same texts and vocab size.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
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
