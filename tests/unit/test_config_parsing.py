"""Settings read from the environment and from stored hashes, parsed without a server:
STREAMQ_CLUSTER, STREAMQ_REDIS_PASSWORD_FILE, stored rate limits, the listing cursor and
the CLI's payload arguments."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import typer

from streamq.cli.submit import parse_argument, parse_jsonl
from streamq.errors import ConfigError
from streamq.producer.rates import parse_rates
from streamq.storage.connection import cluster_mode, password_from_file
from streamq.web.registry_merge import format_cursor, parse_cursor


@pytest.mark.parametrize(("raw", "mode"), [
    ("", None), ("auto", None), (" AUTO ", None),
    ("1", True), ("true", True), ("Yes", True), ("on", True), ("cluster", True),
    ("0", False), ("false", False), ("no", False), ("off", False), ("standalone", False),
])
def test_streamq_cluster_reads_each_spelling(monkeypatch: pytest.MonkeyPatch, raw: str,
                                             mode: bool | None) -> None:
    monkeypatch.setenv("STREAMQ_CLUSTER", raw)
    assert cluster_mode() is mode
    # an explicit value wins over the environment
    assert cluster_mode(True) is True and cluster_mode("off") is False


def test_a_bad_streamq_cluster_is_a_config_error_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMQ_CLUSTER", "maybe")
    with pytest.raises(ConfigError, match="STREAMQ_CLUSTER must be auto, true or false"):
        cluster_mode()


def test_the_password_file_is_read_without_its_newline_and_never_shown(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STREAMQ_REDIS_PASSWORD_FILE", raising=False)
    assert password_from_file() is None
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("STREAMQ_REDIS_PASSWORD_FILE", str(secret))
    assert password_from_file() == "s3cret"
    # an empty or missing file is an error that names the path, not the content
    secret.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        password_from_file()
    monkeypatch.setenv("STREAMQ_REDIS_PASSWORD_FILE", str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="cannot read STREAMQ_REDIS_PASSWORD_FILE") as e:
        password_from_file()
    assert "s3cret" not in str(e.value)


def test_stored_rate_limits_are_parsed_and_malformed_fields_skipped() -> None:
    limits = parse_rates({b"queue": b"10.5|20", b"client:a": b"2|3", b"client:b": b"x|1",
                          b"client:c": b"4", b"other": b"1|1"})
    assert limits.queue is not None and (limits.queue.per_second, limits.queue.burst) == (10.5, 20)
    assert set(limits.clients) == {"a"}
    assert (limits.clients["a"].per_second, limits.clients["a"].burst) == (2.0, 3)
    # and a stored limit reads back as it is stored
    assert parse_rates({b"client:a": limits.clients["a"].spec().encode()}).clients == limits.clients
    empty = parse_rates({})
    assert empty.queue is None and not empty.clients


@pytest.mark.parametrize("cursor", [(0.0, b"job"), (float("inf"), b"\x00\xff|1"),
                                    (-1.5e13, b""), (1e13 + 0.25, "é".encode())])
def test_a_listing_cursor_reads_back_as_made(cursor: tuple[float, bytes]) -> None:
    assert parse_cursor(format_cursor(cursor)) == cursor


@pytest.mark.parametrize("raw", [None, "", "12", "x:00", "1:zz", "nan:00", "1:" + "0" * 5000])
def test_a_cursor_that_is_not_one_is_the_first_page(raw: str | None) -> None:
    assert parse_cursor(raw) is None


def test_payload_arguments_are_json_when_they_are_json_and_strings_otherwise() -> None:
    assert parse_argument('{"n": 1}') == {"n": 1}
    assert parse_argument("12") == 12
    assert parse_argument("hello") == "hello"
    assert parse_argument("[1, 2") == "[1, 2"


def test_a_jsonl_file_skips_blank_lines_and_names_its_bad_line() -> None:
    assert parse_jsonl(io.StringIO('{"a": 1}\n\n[2]\n'), "in.jsonl") == [{"a": 1}, [2]]
    with pytest.raises(typer.BadParameter, match="3"):
        parse_jsonl(io.StringIO('1\n2\n{bad\n'), "in.jsonl")


def test_counts_in_messages_agree_with_their_number() -> None:
    from streamq.cli.common import plural

    assert [plural(n, "shard") for n in (0, 1, 2)] == ["0 shards", "1 shard", "2 shards"]
    assert plural(1, "sub-request") == "1 sub-request"
