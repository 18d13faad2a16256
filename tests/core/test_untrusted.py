"""Text from untrusted code, made fit to show or send on: secrets out, bounded, one line when asked."""

from tracerl.core.untrusted import REDACTED, bounded, scrub, untrusted_text

PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----"


def test_secrets_are_taken_out(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tangerine walrus 42")
    monkeypatch.setenv("HOME_DIR", "/home/someone")  # not a secret's name: left alone
    text = (f"found {PEM} and root:$6$saltsalt$Xy9Qk3LmNpR7sT2vW8zA1bC4dE5fG6hH7iJ8kL9mN0oP.qR:19000:0:99999:7::: "
            "and sk-proj-abcdefghijklmnopqrstuvwxyz012345 and ghp_abcdefghijklmnopqrstuvwxyz0123456789 and "
            "AKIAABCDEFGHIJKLMNOP and ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq and tangerine walrus 42 and "
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 in /home/someone")
    out = scrub(text)
    for secret in ("b3BlbnNzaC1rZXktdjEAAAAABG5vbmU", "$6$saltsalt", "sk-proj-abc", "ghp_abc", "AKIAABCD", "AAAAC3Nza",
                   "tangerine walrus", "e3b0c44298fc"):
        assert secret not in out, secret
    assert out.count(REDACTED) >= 8 and out.endswith("in /home/someone")


def test_paths_names_and_numbers_stay():
    text = ("PermissionError: [Errno 13] Permission denied: '/tmp/pytest-of-root/pytest-106/test_write_outside_0/x.txt' "
            "(at env.py:12); seed 20: oracle scores 0.5; tool 'get_reservation_details' lacks parameter 'reservation_id'")
    assert scrub(text) == text


def test_control_characters_and_escapes_go():
    assert scrub("a\x1b[31mred\x1b[0m\x00b\tc\nd") == "ared\x00b\tc\nd".replace("\x00", "")


def test_bounded_and_one_line():
    assert bounded("x" * 10, 4) == "xxxx… (6 more characters)"
    assert bounded("short", 10) == "short"
    assert untrusted_text("a\n b\n\n c", 100, one_line=True) == "a b c"
