"""The tiny agent's tokenizer: lossless, digits one by one, ids the same tokens in prose and JSON."""

from tracerl.models.tokenizer import train_tokenizer

CORPUS = [
    "Hi! My user id is emma_lopez_940. Please cancel reservation 23Y9BG because of the weather.",
    '{"user_id": "emma_lopez_940", "reservations": ["23Y9BG", "XNEJCA"], "payment_methods": ["gift_card_6507"]}',
] * 20


def pieces(tokenizer, text: str) -> list[str]:
    return [tokenizer.decode([i]) for i in tokenizer.encode(text)]


def test_round_trip_of_any_text():
    tok = train_tokenizer(CORPUS, vocab_size=400)
    for text in ["naïve café ✈ 2024-05-15", "  two  spaces\n\nand lines", '{"a": [1, 2.5, null]}', "emma_lopez_940"]:
        assert tok.decode(tok.encode(text)) == text


def test_every_digit_is_a_token():
    tok = train_tokenizer(CORPUS, vocab_size=400)
    assert pieces(tok, "940")[-3:] == ["9", "4", "0"]
    assert pieces(tok, "gift_card_6507")[-4:] == ["6", "5", "0", "7"]


def test_an_id_is_the_same_tokens_in_prose_and_in_a_tool_call():
    tok = train_tokenizer(CORPUS, vocab_size=400)
    for value in ["emma_lopez_940", "23Y9BG", "gift_card_6507"]:
        alone = tok.encode(value)
        in_prose = tok.encode(f"My id is {value}. Thanks")
        in_json = tok.encode(f'{{"user_id": "{value}"}}')
        for ids in (in_prose, in_json):
            assert any(ids[k:k + len(alone)] == alone for k in range(len(ids))), (value, pieces(tok, value))


def test_atomic_ids_are_one_token_everywhere_and_round_trip():
    from tracerl.envs.airline.tasks import generate_task, id_vocabulary

    ids = id_vocabulary()
    tok = train_tokenizer(CORPUS, vocab_size=400, atomic=ids)
    assert tok.convert_tokens_to_ids(ids) == list(range(len(tok) - len(ids), len(tok)))  # one token each, last
    task = generate_task(7)
    for value in [task.user_id, task.subtasks[0].reservation_id, "gift_card_07", "HAT42"]:
        for text in (f"My id is {value}. Thanks", f'{{"reservation_id": "{value}"}}', f"[{value}, {value}]"):
            encoded = tok.encode(text)
            assert tok.decode(encoded) == text
            assert sum(tok.decode([i]) == value for i in encoded) == text.count(value), (text, pieces(tok, text))
    text = task.opening + " " + task.model_dump_json()
    assert tok.decode(tok.encode(text)) == text


def test_atomic_strings_are_left_out_of_the_merges():
    corpus = ["paid with gift_card_65 and wren_amber"] * 50
    merged = set(train_tokenizer(corpus, vocab_size=400).get_vocab())
    atomic = set(train_tokenizer(corpus, vocab_size=400, atomic=["gift_card_65", "wren_amber"]).get_vocab())
    assert any("gift" in t for t in merged)
    assert not any("gift" in t or "amber" in t for t in atomic - {"gift_card_65", "wren_amber"})


def test_bad_atomic_strings_are_refused():
    import pytest

    for bad in ["", "two words", "naïve"]:
        with pytest.raises(ValueError, match="atomic strings"):
            train_tokenizer(CORPUS, vocab_size=400, atomic=["ok_1", bad])
