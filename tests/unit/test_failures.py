"""A handler's failure as recorded text: summary, traceback, bound (no server)."""

from __future__ import annotations

import traceback

from streamq.base.failures import MAX_FAILURE_CHARS, failure_text, split_failure, summary


def _raised(e: Exception) -> Exception:
    try:
        raise e
    except Exception as caught:
        return caught


def test_a_raised_error_keeps_its_summary_and_traceback_apart() -> None:
    def deep() -> None:
        raise KeyError("missing")

    try:
        deep()
    except KeyError as e:
        text = failure_text(e)
    head, tb = split_failure(text)
    assert head == "KeyError: 'missing'"
    assert tb.startswith("Traceback (most recent call last):\n")
    assert "in deep" in tb and tb.rstrip().endswith("KeyError: 'missing'")


def test_a_chained_cause_is_kept() -> None:
    try:
        try:
            raise ValueError("inner")
        except ValueError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as e:
        _, tb = split_failure(failure_text(e))
    assert "ValueError: inner" in tb and "direct cause" in tb and "RuntimeError: outer" in tb


def test_an_error_never_raised_is_its_summary_alone() -> None:
    assert failure_text(TimeoutError("ran past 2 s")) == "TimeoutError: ran past 2 s"
    assert split_failure("TimeoutError: ran past 2 s") == ("TimeoutError: ran past 2 s", "")
    assert summary(RuntimeError()) == "RuntimeError"


def test_a_huge_traceback_is_bounded_and_keeps_where_it_was_raised() -> None:
    e = _raised(RuntimeError("x" * (3 * MAX_FAILURE_CHARS)))
    text = failure_text(e)
    assert len(text) <= MAX_FAILURE_CHARS
    assert text.startswith("RuntimeError: xxx") and "characters cut" in text
    full = "".join(traceback.format_exception(e)).rstrip("\n")
    assert text.endswith(full[-200:])  # the end: where it was raised


def test_a_message_with_lines_of_its_own_stays_in_the_summary() -> None:
    e = _raised(ValueError("line one\nline two"))
    head, tb = split_failure(failure_text(e))
    assert head == "ValueError: line one\nline two" and "in _raised" in tb


def test_a_failure_text_is_utf8_whatever_its_message_holds() -> None:
    import os

    try:
        raise ValueError("no file " + os.fsdecode(b"caf\xe9.csv") + " \u00e9")
    except ValueError as e:
        text = failure_text(e)
    # the lone surrogate is written as its escape; a character UTF-8 carries stays
    assert text.startswith("ValueError: no file caf\\udce9.csv \u00e9")
    assert text.encode("utf-8").decode("utf-8") == text
    assert failure_text(ValueError("\udcff")) == "ValueError: \\udcff"
