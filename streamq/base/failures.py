"""A handler's failure as text: one summary line (``Type: message``) and its traceback.

A failed attempt is recorded with :func:`failure_text`, which dead letters, the
job's errors and the dashboard keep whole; :func:`split_failure` takes the two
parts apart again for a one-line listing (``streamq dlq list``) and a full view
(``streamq dlq show``, the dashboard's dead-letter page).
"""

from __future__ import annotations

import traceback

__all__ = ["MAX_FAILURE_CHARS", "TRACEBACK_MARK", "failure_text", "split_failure", "summary",
           "utf8_text"]

#: where a failure's traceback begins in its text
TRACEBACK_MARK = "\n\nTraceback (most recent call last):\n"
#: the longest failure text recorded; a longer traceback keeps its start and its end
#: (where it was raised), the middle cut (the server's contract takes up to 1 MiB)
MAX_FAILURE_CHARS = 32 * 1024


def summary(e: BaseException) -> str:
    """``Type: message`` (the type alone when the message is empty)."""
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def utf8_text(text: str) -> str:
    """``text`` as UTF-8 can carry it: a character it cannot (a lone surrogate, as
    ``os.fsdecode`` makes of a name's undecodable bytes) written as its escape
    (``\\udcff``). A failure's text is stored where its readers decode UTF-8, and the
    server refuses one that is not."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def failure_text(e: BaseException) -> str:
    """``e``'s summary, then its traceback (with any chained cause) when it has one,
    bounded by ``MAX_FAILURE_CHARS``; valid UTF-8 (:func:`utf8_text`) whatever the
    exception's message holds."""
    head = utf8_text(summary(e))
    if e.__traceback__ is None and e.__cause__ is None and e.__context__ is None:
        return head[:MAX_FAILURE_CHARS]
    tb = utf8_text("".join(traceback.format_exception(e)).rstrip("\n"))
    if not tb.startswith("Traceback (most recent call last):\n"):
        return head[:MAX_FAILURE_CHARS]
    text = head + TRACEBACK_MARK + tb.split("\n", 1)[1]
    if len(text) <= MAX_FAILURE_CHARS:
        return text
    cut = len(text) - MAX_FAILURE_CHARS + 64
    keep = (MAX_FAILURE_CHARS - 64) // 2
    return f"{text[:keep]}\n  ... ({cut:,} characters cut) ...\n{text[-keep:]}"


def split_failure(text: str) -> tuple[str, str]:
    """(summary, traceback) of a recorded failure; the traceback is "" when none was
    recorded (a timeout, a malformed entry, a failure recorded without one)."""
    at = text.find(TRACEBACK_MARK)
    if at < 0:
        return text, ""
    return text[:at], "Traceback (most recent call last):\n" + text[at + len(TRACEBACK_MARK):]
