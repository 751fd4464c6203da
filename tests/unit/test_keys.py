"""streamq.base.keys, the single source of key names: every key of a queue shard shares
one cluster slot, every key of a job shares another, and bad names are refused
before any key is built. No server: the slot is redis-py's own CRC16."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from redis.crc import key_slot

from streamq.base import keys, members
from streamq.base.keys import JobKeys, QueueKeys
from streamq.errors import ConfigError


def _names(obj: Any) -> list[str]:
    """Every key name an object of keys gives, called with sample arguments."""
    out: list[str] = []
    cls = type(obj)
    for name, member in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        if isinstance(member, (property, keys.cached_property)):
            value = getattr(obj, name)
            if isinstance(value, str) and value.startswith("sq:"):  # a key, not a tag
                out.append(value)
        elif inspect.isfunction(member):
            params = list(inspect.signature(member).parameters.values())[1:]
            sample = {"priority": 7, "client": "acme", "job_id": "j1", "worker_id": "w1",
                      "letter": "1-0", "entry_id": "2-0"}
            made = member(obj, *(sample[p.name] for p in params))
            if isinstance(made, str):  # a key name (``job`` gives a job's keys)
                out.append(made)
    return out


@pytest.mark.parametrize("tag", ["images", "images~3"])
def test_every_key_of_a_queue_shard_is_in_one_slot(tag: str) -> None:
    qk = QueueKeys("images", tag)
    # the queue's own configuration, rate limits and repeats live in its first shard's slot
    whole_queue = {qk.config, qk.rates, qk.buckets, qk.repeats, qk.repeat_next, qk.repeat_last}
    names = [n for n in _names(qk) if n not in whole_queue]
    assert len(names) > 30  # every key of the class was called
    assert {key_slot(n.encode()) for n in names} == {key_slot(f"{{{tag}}}".encode())}
    assert all(n.startswith(f"sq:{{{tag}}}:") for n in names)
    assert {key_slot(n.encode()) for n in whole_queue} == {key_slot(b"{images}")}


def test_every_key_of_a_job_is_in_its_own_slot() -> None:
    names = _names(JobKeys("job-42", "images"))
    assert len(names) >= 10
    assert {key_slot(n.encode()) for n in names} == {key_slot(b"{images/job-42}")}


def test_one_job_id_in_two_queues_names_two_jobs() -> None:
    # a job id is the queue's: the same id in another queue has keys of its own
    a, b = JobKeys("shared1", "images"), JobKeys("shared1", "videos")
    assert set(_names(a)).isdisjoint(_names(b))
    assert QueueKeys("images", "images~2").job("shared1") == a  # whatever the shard


def test_two_shards_of_one_queue_are_two_tags() -> None:
    assert QueueKeys("q", "q~1").ready != QueueKeys("q", "q~2").ready
    assert keys.shard_queue("q~2") == "q" and keys.shard_queue("q") == "q"


@pytest.mark.parametrize("bad", ["", "a b", "x{y}", "é", "a" * 129, "new\nline"])
def test_a_bad_queue_name_or_job_id_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="use 1-128 characters"):
        QueueKeys(bad)
    with pytest.raises(ConfigError, match="use 1-128 characters"):
        JobKeys(bad, "q")
    with pytest.raises(ConfigError, match="use 1-128 characters"):
        JobKeys("job", bad)


@pytest.mark.parametrize("tag", ["other~1", "q~", "q~x", "q-1"])
def test_a_shard_tag_of_another_queue_or_malformed_is_refused(tag: str) -> None:
    with pytest.raises(ConfigError, match="invalid shard"):
        QueueKeys("q", tag)


def test_a_client_name_may_not_be_another_clients_retry_set() -> None:
    # lane:<prio>:<client> and lane:<prio>:<client>:retry would be one key
    assert keys.check_client("team-a") == "team-a"
    with pytest.raises(ConfigError, match="may not end with ':retry'"):
        keys.check_client("x:retry")
    qk = QueueKeys("q")
    assert qk.lane(3, "x:retry") == qk.lane_retry(3, "x")


def test_members_and_tokens_read_back_what_was_written() -> None:
    assert members.parse_intent(members.intent("j1", "upload-42")) == ("j1", "upload-42")
    assert members.parse_intent(members.intent("j1")) == ("j1", "")
    assert members.parse_lane_member(members.lane_member(7, "acme:eu")) == (7, "acme:eu")
    assert members.token_job(members.token("job#odd", 3)) == "job#odd"
    assert members.owner_worker(members.owner("host/1/w", 2)) == "host/1/w"
    assert members.owner_worker("legacy") == "legacy"
