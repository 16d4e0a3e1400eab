"""RFC 2047 encoded words in job data never reach a mail
reader as something to decode. A job name like ``=?utf-8?q?=E2=80=AEfdp.exe?=``
is shown literally (its characters as typed), never as a right-to-left
override, an encoded CR/LF never becomes a line break, and an address with an
encoded word is refused. Every check parses the serialised message with
Python's email parser (``policy.default``, which decodes encoded words the way
mail readers do)."""

from __future__ import annotations

import unicodedata
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser

import pytest

from gsrun.base.errors import InputError
from gsrun.report.mail import build_message, clean_line, set_text_header, validate_addr
from gsrun.report.records import JobSummary

pytestmark = pytest.mark.pure

TO = "alice@example.org"
FROM = "gsrun@cluster.example"
BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)}

HOSTILE = [
    "=?utf-8?q?=E2=80=AEfdp.exe?=",                          # RLO -> "exe.pdf" on screen
    "=?UTF-8?B?4oCuZmRwLmV4ZQ==?=",                           # same, base64
    "=?utf-8?q?a=0D=0ABcc:_evil@example.com?=",               # encoded CR/LF + a header
    "=?utf-8?q?=E2=81=A6x=E2=81=A9=E2=80=8F=D8=9C?=",         # isolates, RLM, ALM
    "x =?utf-8?q?=3D=3Futf-8=3Fq=3F=3DE2=3D80=3DAE=3F=3D?= y",  # nested: decodes to another encoded word
    "=?utf-8?q?" + "=E2=80=AE" * 40 + "?=",                   # overlong encoded word (> 75 chars)
    "=?iso-8859-1?q?=0D=0A?= =?bogus-charset?q?x?= =?utf-8?x?y?=",  # odd charsets / encodings
    "=?", "?=", "==??", "a=?b",
]


def summary(name: str, array: str | None = None) -> JobSummary:
    return JobSummary.from_json({
            "schema": "gsrun.summary/1", "kind": "job",
            "job": {"id": "42", "array": array, "user": "u", "name": name, "state": "COMPLETED", "exit_code": 0,
                    "nodes": ["n1"], "elapsed_s": 60.0, "mail_user": TO, "mail_type": "END"},
            "cpu": {"efficiency_pct": 42.0}, "gpu": {"available": False, "devices": []}})


def reparsed(msg: EmailMessage) -> EmailMessage:
    return BytesParser(policy=policy.default).parsebytes(msg.as_bytes())


def shown(value: str) -> None:
    """No character a reader would act on or that hides what follows."""
    assert not any(c in BIDI or unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in value), repr(value)


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_job_name_is_shown_literally_in_the_decoded_subject(name):
    msg = reparsed(build_message(summary(name), "report", None, TO, FROM, date=0))
    subject = str(msg["Subject"])
    shown(subject)
    want = clean_line(name, 60)
    assert f"({want})" in subject, (subject, want)      # the characters as typed
    assert subject.startswith("[gsrun] job 42 (") and subject.endswith("CPU eff 42%")
    assert msg.get_all("Bcc") is None and len(msg.get_all("Subject")) == 1
    raw = msg.as_bytes().split(b"\n\n", 1)[0]
    assert raw.isascii() and all(len(line) <= 998 for line in raw.split(b"\n"))


def test_the_rlo_example_decodes_to_itself_not_to_an_override():
    name = "=?utf-8?q?=E2=80=AEfdp.exe?="
    msg = reparsed(build_message(summary(name), "report", None, TO, FROM, date=0))
    assert f"[gsrun] job 42 ({name}) COMPLETED" in str(msg["Subject"])
    assert "\u202e" not in str(msg["Subject"]) and "fdp.exe?=" in str(msg["Subject"])


def test_plain_subject_keeps_its_plain_wire_form():
    msg = build_message(summary("train"), "report", None, TO, FROM, date=0)
    assert b"\nSubject: [gsrun] job 42 (train) COMPLETED" in msg.as_bytes()


def test_literal_controls_and_bidi_are_stripped_and_words_kept_literal():
    name = "\u202ea\r\nBcc: x@y\u2066 =?utf-8?q?=0A?=\x1b[31m"
    msg = reparsed(build_message(summary(name), "report", None, TO, FROM, date=0))
    subject = str(msg["Subject"])
    shown(subject)
    assert "a Bcc: x@y =?utf-8?q?=0A?=" in subject and msg.get_all("Bcc") is None


@pytest.mark.parametrize("text", ["=?utf-8?q?=E2=80=AE?=", "x" * 300 + "=?", "é=?ü?="])
def test_set_text_header_round_trips_any_header(text):
    m = EmailMessage(policy=policy.default)
    m["To"] = TO
    got = set_text_header(m, "X-Gsrun-Test", text, 250)
    assert str(reparsed(m)["X-Gsrun-Test"]) == got == clean_line(text, 250)


def test_x_gsrun_job_header_is_literal_too():
    s = summary("t", array="=?utf-8?q?=E2=80=AE1?=")
    msg = reparsed(build_message(s, "report", None, TO, FROM, date=0))
    assert str(msg["X-Gsrun-Job"]) == "=?utf-8?q?=E2=80=AE1?="


@pytest.mark.parametrize("addr", ["=?utf-8?q?=E2=80=AE?=@example.com", "a=?x?=@example.com",
                                  "=?utf-8?q?evil=0D=0ABcc=3A_x?=@example.com"])
def test_address_with_an_encoded_word_is_refused(addr):
    with pytest.raises(InputError, match="encoded word"):
        validate_addr(addr)
    with pytest.raises(InputError):
        build_message(summary("t"), "report", None, addr, FROM)
