"""Train a small Qwen3-style tokenizer with the `tokenizers` library (byte-level BPE).

Byte-level BPE covers every byte, so `decode(encode(text)) == text` for any text; the ChatML
markers and the tool-call tags are single added tokens, as in Qwen3's tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tracerl.models.templates import END_OF_TURN, MARKUP_TOKENS, SPECIAL_TOKENS, TINY_AGENT_TEMPLATE


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 1024, chat_template: str = TINY_AGENT_TEMPLATE
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts`, wrapped for transformers, chat template set.

    Ids 0..8 are the special and markup tokens (`<|endoftext|>` = 0 is also the pad token), then
    the 256 byte symbols, then the merges. Deterministic for the same texts and vocab size.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
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
