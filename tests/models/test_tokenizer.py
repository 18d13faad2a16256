"""The tiny agent's tokenizer: lossless, digits one by one or numbers in runs of three, ids the same tokens in prose and JSON."""

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


def test_numbers_of_up_to_three_digits_are_one_token_each():
    tok = train_tokenizer(CORPUS, vocab_size=400, number_digits=3)
    assert all(len(tok.encode(run)) == 1 for n in (1, 2, 3) for run in (f"{v:0{n}d}" for v in range(10 ** n)))
    assert pieces(tok, "1234") == ["123", "4"]  # runs cut from the left
    assert pieces(tok, "2024-05-15") == ["202", "4", "-", "05", "-", "15"]
    for text in ["emma_lopez_940 paid 12345", "HAT437 on 2024-05-15", "0007"]:
        assert tok.decode(tok.encode(text)) == text


def test_number_tokens_extend_the_trained_vocabulary():
    plain, numbers = train_tokenizer(CORPUS, vocab_size=400), train_tokenizer(CORPUS, vocab_size=400, number_digits=3)
    assert len(plain) + 1000 < len(numbers) <= len(plain) + 1100  # runs of 2-3 digits, some learnt anyway
    assert pieces(numbers, "emma_lopez") == pieces(plain, "emma_lopez")


def test_with_json_keys_a_value_is_the_token_after_its_key():
    record = '{"payment_history": [{"amount": 582, "payment_id": "gift_card_basket"}], "reservation_id": "pebble"}'
    call = '{"reservation_id":"pebble","total_baggages":13}'
    corpus = CORPUS + [record, call] * 20
    tok = train_tokenizer(corpus, vocab_size=400, number_digits=3, json_keys=True)
    assert pieces(tok, record)[3:5] == ['"amount": ', "582"]
    assert pieces(tok, record)[7] == '"payment_id": "'
    assert pieces(tok, call)[:3] == ["{", '"reservation_id":"', "pebble"]
    assert "582" in pieces(tok, "The refund is 582 dollars")  # the same token in prose
    for text in [record, call, 'She said "hi": fine', *CORPUS]:
        assert tok.decode(tok.encode(text)) == text
    plain = train_tokenizer(corpus, vocab_size=400, number_digits=3)
    assert pieces(plain, record)[pieces(plain, record).index("582") - 1] == " "  # without: a space, then `":`, then the key
