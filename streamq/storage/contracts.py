"""The declared contract of every script of streamq's library (see :mod:`streamq.contract`).

One entry per ``lua/<name>-<numkeys>.lua``: its keys (each of a kind, all of one
tag), its arguments, its reply, its error codes, the roles that may call it and
its flags. The prologue of every function, the Python-side check of every call,
the roles' function lists and the reference tables of docs/design/scripts.md are made
from this module; tests fail when a Lua header, a stub, an ACL rule or a doc
table disagrees with it.
"""

from __future__ import annotations

from dataclasses import replace

from streamq.base.config import DEFAULT_DEAD_MAXLEN, GROUP, MAX_CONCURRENCY, MAX_PRIORITY
from streamq.storage.contract import Arg, Contract, Counted, KeyKind

__all__ = ["CONTRACTS", "KINDS", "contract"]

_NAME = r"[A-Za-z0-9_.:\-]{1,128}"
_TOKEN = r"[!-z|~]{1,300}"


def _kinds(slot: str, rtype: str, names: str) -> dict[str, KeyKind]:
    return {n: KeyKind(n, slot, rtype) for n in names.split()}


#: every kind of key a script may name, by name
KINDS: dict[str, KeyKind] = {
    **_kinds("job", "HASH", "meta results errors inflight dlq batches added ids"),
    **_kinds("job", "STREAM", "tasks"),
    **_kinds("job", "ZSET", "retry"),
    **_kinds("job", "SET", "unannounced"),
    **_kinds("shard", "ZSET", "ready leased parked active finished dedupx creating workers "
             "retries owed lanes lactive ldone"),
    **_kinds("shard", "HASH", "tokens owners kick fair dedup ljobs lresults lerrors lstarts "
             "reaping"),
    **_kinds("shard", "STREAM", "stats events dead lkept"),
    **_kinds("shard", "LIST", "wake"),
    **_kinds("shard", "STRING", "paused reaper-lock"),
    **_kinds("queue", "HASH", "rates buckets repeats"),
    **_kinds("queue", "ZSET", "repeat-next repeat-last"),
    "worker": KeyKind("worker", "shard", "HASH", r"worker:" + _TOKEN,
                      "^worker:[!-z|~]+$", "worker:<id>"),
    "lane": KeyKind("lane", "shard", "STREAM", r"lane:[0-9]{1,2}:" + _NAME,
                    "^lane:%d%d?:[%w_%.:%-]+$", "lane:<prio>:<client>", never_ends=":retry"),
    "lane-retry": KeyKind("lane-retry", "shard", "ZSET", r"lane:[0-9]{1,2}:" + _NAME + ":retry",
                          "^lane:%d%d?:[%w_%.:%-]+:retry$", "lane:<prio>:<client>:retry"),
    "work": KeyKind("work", "shard", "STREAM", r"lane:[0-9]{1,2}:" + _NAME,
                    "^lane:%d%d?:[%w_%.:%-]+$", "tasks|lane:<prio>:<client>", exact="tasks",
                    never_ends=":retry"),
    "announced": KeyKind("announced", "shard", "STRING", r"announced:" + _TOKEN,
                         "^announced:[!-z|~]+$", "announced:<job>|<created>|<field>|<serial>"),
    "replayed": KeyKind("replayed", "shard", "STRING", r"replayed:" + _TOKEN,
                        "^replayed:[!-z|~]+$", "replayed:<job>|<created>|<field>|<serial>"),
    "replayed-id": KeyKind("replayed-id", "shard", "STRING", r"replayed-id:[0-9]{1,20}-[0-9]{1,20}",
                           "^replayed%-id:%d+%-%d+$", "replayed-id:<entry id>"),
}

_MS = 10**13  # every duration or time in ms is below this (about 317 years)
_N = 10**9  # counts and caps
_BIG = 512 * 1024 * 1024  # Redis's largest bulk string: payloads and results
_TEXT = 1024 * 1024  # error texts (a traceback), records


def _k(names: str) -> tuple[KeyKind, ...]:
    return tuple(KINDS[n] for n in names.split())


def i(name: str, lo: int = 0, hi: int = _N, *, empty: bool = False) -> Arg:
    return Arg(name, "int", lo=lo, hi=hi, empty=empty)


def ms(name: str, *, empty: bool = False, lo: int = 0) -> Arg:
    return Arg(name, "int", lo=lo, hi=_MS, empty=empty)


def name(n: str, *, empty: bool = False) -> Arg:
    return Arg(n, "name", empty=empty)


def tok(n: str, *, empty: bool = False, size: int = 300) -> Arg:
    return Arg(n, "token", size=size, empty=empty)


def text(n: str, size: int = _TEXT, *, utf8: bool = False) -> Arg:
    return Arg(n, "text", size=size, utf8=utf8)


def enum(n: str, *values: str) -> Arg:
    return Arg(n, "enum", values=values)


def pat(n: str, regex: str, lua: str, doc: str, size: int = 300, *, empty: bool = False) -> Arg:
    return Arg(n, "pattern", regex=regex, lua=lua, doc=doc, size=size, empty=empty)


GROUP_ARG = enum("group", GROUP)
SHARD = pat("queue", _NAME + r"(?:~[0-9]{1,4})?", "^[%w_%.:%-]+$\n^[%w_%.:%-]+~%d%d?%d?%d?$",
            "<queue>[~<n>]", 140)
ENTRY = Arg("entry id", "entry")
KIND = enum("payload type", "b", "s", "j")
#: the type letter a failure carries: a malformed entry's own, whatever it was
FAILED_KIND = text("payload type", 16)
PAYLOAD = text("payload", _BIG)
#: a W3C traceparent (version, trace id, parent id, flags: lowercase hex): kept in a
#: small job's retry member between "," and "|", so neither may be in it
TRACE = pat("trace context", r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}",
            "^[%da-f][%da-f]%-" + "[%da-f]" * 32 + "%-" + "[%da-f]" * 16 + "%-[%da-f][%da-f]$",
            "<traceparent>", 55, empty=True)
PRIORITY = i("priority", 0, MAX_PRIORITY)
CONCURRENCY = i("concurrency", 1, MAX_CONCURRENCY)
WAKE_CAP = i("cap on wake-up signals", 0, 100_000)
TOKEN = pat("token", _NAME + r"#[0-9]{1,5}", "^[%w_%.:%-]+#%d+$", "<job>#<n>", 140)
LANE_MEMBER = pat("lane member", r"[0-9]{1,2}\|" + _NAME, "^%d%d?|[%w_%.:%-]+$", "<prio>|<client>",
                  132)
JSON = pat("JSON record", r"\{.*\}", "^{.*}$", "{...}", _TEXT)
_D20 = "%d" + "%d?" * 19  # 1 to 20 digits (Lua patterns have no {1,20})
_D12, _D9 = "%d" + "%d?" * 11, "%d" + "%d?" * 8
FIELD = pat("field", r"-?[0-9]{1,15}|entry:[0-9]{1,20}-[0-9]{1,20}",
            "^%-?%d%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?$\n^entry:" + _D20 + "%-" + _D20 + "$",
            "<index> or entry:<id>", 60)
#: a shard's dead stream cap (XADD MAXLEN ~): the deployment's (a smaller one trims others')
DEAD_CAP = i("dead stream cap", DEFAULT_DEAD_MAXLEN)
#: a failure's error text, kept where its readers decode UTF-8 (status, announce, retry)
ERROR = text("error", utf8=True)
#: what every lane script that completes jobs is told (channels come from its tag)
LANE_CTX = (GROUP_ARG, i("events cap"), ms("events retention"))

_P, _W, _R, _A = ("producer",), ("worker",), ("reaper",), ("admin",)
#: what submits jobs: producers, and the reapers that submit repeats' ticks
_PR = ("producer", "reaper")
JOB_ALL = "meta tasks results errors retry inflight added ids dlq unannounced"

_LIST = [
    Contract("abort_job", "abort an open or active job: terminal `aborted`, its work dropped",
             _k(JOB_ALL), (text("reason", 4096, utf8=True), tok("closer", empty=True),
                           tok("write token", empty=True)),
             reply="job_reply", errors=("JOB_NOT_FOUND",), roles=_P, flags=("allow-oom",)),
    Contract("ack", "acknowledge sub-requests, store their results, complete the job",
             _k("tasks meta results errors inflight dlq"), (GROUP_ARG,),
             rest=(ENTRY, i("index"), text("result", _BIG)), least=1,
             reply="{acknowledged, job_reply...}", roles=_W, flags=("allow-oom",)),
    Contract("add_keyed", "fenced add of sub-requests by deterministic id (Spark)",
             _k("meta tasks added ids"),
             (ms("lifetime"), tok("write token"), i("partition"), i("attempt")),
             rest=(tok("id"), tok("digest", empty=True), KIND, PAYLOAD), tail=(TRACE,),
             reply="{added, skipped, total}",
             errors=("JOB_NOT_FOUND", "JOB_CLOSED", "NOT_WRITER", "ROW_CHANGED", "DUPLICATE_ID"),
             roles=_P),
    Contract("add_tasks", "append sub-requests to an open job (idempotent by batch id)",
             _k("meta tasks batches retry"), (i("expected total", empty=True), tok("batch id")),
             rest=(KIND, PAYLOAD), tail=(TRACE,), reply="index after the last one added",
             errors=("JOB_NOT_FOUND", "JOB_CLOSED", "TOTAL_MISMATCH"), roles=_P),
    Contract("announce", "copy one dead letter to the queue's dead stream, once",
             _k("dead announced"),
             (DEAD_CAP, ms("marker lifetime"), name("job id"), FIELD,
              ERROR, i("attempts"), ms("time"), FAILED_KIND, PAYLOAD, i("serial"),
              ms("job created")),
             reply="dead entry id", roles=("worker", "reaper"), flags=("allow-oom",),
             key_of=((2, (3, 11, 4, 10)),)),
    Contract("announced", "note dead letters as announced in their job",
             _k("unannounced errors"), rest=(FIELD, i("serial")), reply="count",
             roles=("worker", "reaper"), flags=("allow-oom",)),
    Contract("cancel_job", "cancel a live job: terminal `cancelled`, held entries released",
             _k(JOB_ALL), (GROUP_ARG, tok("closer")), reply="job_reply + held entries",
             errors=("JOB_NOT_FOUND",), roles=_P, flags=("allow-oom",)),
    Contract("clear_owed", "remove a job from `owed` once its dead letters are announced",
             _k("owed"), (name("job id"), pat("score", r"[0-9]{1,15}(?:\.[0-9]{1,6})?",
                                              "^%d+%.?%d*$", "<ms>", 24, empty=True)), reply="0|1",
             roles=("worker", "reaper"), flags=("allow-oom",)),
    Contract("commit_batch", "record a streaming batch's sub-request count (Spark)",
             _k("meta"), (tok("write token"), i("batch id"), i("produced")),
             reply="1 committed, 0 before",
             errors=("JOB_NOT_FOUND", "JOB_CLOSED", "NOT_WRITER", "TOTAL_MISMATCH"), roles=_P),
    Contract("create_job", "create a job: meta, stream and group, first sub-requests",
             _k("meta tasks results errors dlq retry"),
             (SHARD, PRIORITY, CONCURRENCY, name("client"), i("max deliveries", 1),
              tok("incarnation"), ms("retention"), tok("dedup key", empty=True),
              enum("mode", "final", "open", "submit"), GROUP_ARG,
              pat("when", r"[+@][0-9]{1,15}", "^[+@]%d+$", "+<ms> or @<ms>", 16, empty=True),
              ms("timeout")),
             rest=(KIND, PAYLOAD), tail=(TRACE,), reply="{created, incarnation, job_reply...}",
             errors=("AT_PAST",), roles=_PR),
    Contract("delete_consumers", "delete idle consumers that hold nothing",
             _k("work"), (GROUP_ARG, ms("min idle")), rest=(tok("consumer"),),
             reply="consumers deleted", roles=_R, flags=("allow-oom",)),
    Contract("delete_job", "delete a finished job's records now",
             _k("meta tasks results errors retry inflight dlq unannounced batches added ids"), (),
             reply="1", errors=("JOB_NOT_FOUND", "NOT_FINISHED"), roles=_A),
    Contract("drop_intent", "drop a submit's intent (and its dedup reservation)",
             _k("creating dedup dedupx"),
             (name("job id"), tok("dedup key", empty=True), ms("intent time", empty=True)),
             reply="0|1", roles=_R, flags=("allow-oom",)),
    Contract("expire_keyed", "give a Spark job's keyed-add maps the job's retention",
             _k("meta added ids"), reply="0|1", errors=("JOB_NOT_FOUND",), roles=_P,
             flags=("allow-oom",)),
    Contract("expire_orphan", "give keys of a job without meta a TTL", _k(
        "meta tasks results errors retry inflight dlq unannounced added ids"),
             (ms("retention"),), reply="keys given a TTL", roles=_R, flags=("allow-oom",)),
    Contract("fail", "a failed attempt: retry with backoff or dead-letter",
             _k("tasks meta results errors retry inflight dlq unannounced"),
             (GROUP_ARG, ENTRY, i("index", -1), i("attempts"), ms("retry delay", lo=-1),
              ERROR, FAILED_KIND, PAYLOAD), tail=(TRACE,), reply="{code, job_reply...}",
             roles=_W, flags=("allow-oom",)),
    Contract("finalize_job", "finalize an open job (idempotent by closer token)",
             _k("meta tasks results errors dlq"),
             (tok("closer", empty=True), tok("write token", empty=True),
              i("expected total", empty=True)), reply="job_reply",
             errors=("JOB_NOT_FOUND", "NOT_WRITER", "TOTAL_MISMATCH"), roles=_P,
             flags=("allow-oom",)),
    Contract("finish_jobs", "finish terminal jobs in their queue: the one completion",
             _k("active finished events tokens ready leased parked owners kick dedupx owed "
                "creating"), (i("events cap"), ms("events retention")),
             rest=(name("job id"), enum("state", "succeeded", "partial", "failed", "aborted",
                                        "cancelled"),
                   i("total"), i("done"), i("failed"), ms("retention"), CONCURRENCY,
                   tok("dedup key", empty=True), JSON, tok("incarnation", empty=True),
                   i("dead")),
             reply="one code per job", roles=("producer", "worker", "reaper"),
             flags=("allow-oom",), publishes=True),
    Contract("forget_job", "forget a job whose keys are gone: registry and tokens",
             _k("active tokens ready leased parked owners kick"),
             (name("job id"), i("most tokens", 1, MAX_CONCURRENCY)), reply="0|1", roles=_R,
             flags=("allow-oom",)),
    Contract("heartbeat", "a worker's beat: its deadline, description, stats, leases",
             _k("workers worker leased owners stats"),
             (tok("worker id"), ms("heartbeat lifetime"), ms("lease length"),
              ms("description lifetime"), tok("stats batch", empty=True), ms("stats window"),
              Counted("stats pairs", (tok("stat"), i("count", -_N))),
              Counted("description pairs", (tok("field", size=64), text("value", 4096)), 100)),
             rest=(TOKEN, tok("owner")), reply="tokens lost", roles=_W, flags=("allow-oom",),
             key_of=((2, (1,)),)),
    Contract("intend_jobs", "record submits' intents in `creating`", _k("creating"),
             rest=(Arg("intent", "intent"),), least=1, reply="count", roles=_PR),
    Contract("lane_ack", "acknowledge small jobs and complete them", _k(
        "lane ljobs lresults lerrors lstarts lactive ldone events lkept"), LANE_CTX,
             rest=(ENTRY, name("job id"), text("result", _BIG)),
             reply="{acknowledged, completed}", roles=_W, flags=("allow-oom",),
             publishes=True),
    Contract("lane_cancel", "cancel a small job", _k(
        "lane lane-retry ljobs lactive ldone events lkept"),
             (*LANE_CTX, name("job id"), name("closer", empty=True)),
             reply="{cancelled, held}; {2, \"\"} moved", errors=("JOB_NOT_FOUND",),
             roles=_P, flags=("allow-oom",), publishes=True, retry_of=((2, 1),)),
    Contract("lane_delete", "delete a finished small job's records (and a held entry) now",
             _k("lane ljobs lresults lerrors ldone"), (GROUP_ARG, LANE_MEMBER, name("job id")),
             reply="1", errors=("JOB_NOT_FOUND", "NOT_FINISHED"), roles=_A,
             lane_binds=((1, 2),)),
    Contract("lane_retry", "re-run a failed small job in place, once",
             _k("lane lanes ljobs lerrors lactive ldone dead wake replayed replayed-id"),
             (GROUP_ARG, LANE_MEMBER, WAKE_CAP, name("job id"), ENTRY, name("retry token"),
              ms("marker lifetime", lo=1)),
             reply="1 now, 2 before", errors=("JOB_NOT_FOUND", "NOT_FINISHED", "NOTHING_TO_RETRY"),
             roles=_A, lane_binds=((1, 2),)),
    Contract("lane_drop", "delete an idle lane", _k("lane lane-retry lanes"),
             (GROUP_ARG, LANE_MEMBER), reply="0|1", roles=_R, flags=("allow-oom",),
             lane_binds=((1, 2), (2, 2))),
    Contract("lane_fail", "a failed attempt of a small job: retry or dead-letter", _k(
        "lane lane-retry ljobs lerrors lstarts lactive ldone events dead retries lkept"),
             (*LANE_CTX, DEAD_CAP, LANE_MEMBER, ENTRY, name("job id", empty=True),
              i("attempts"), ms("retry delay", lo=-1), ERROR, FAILED_KIND, PAYLOAD),
             tail=(TRACE,), reply="0 settled before, 1 retry, 2 dead-lettered", roles=_W,
             flags=("allow-oom",), publishes=True, lane_binds=((1, 5), (2, 5))),
    Contract("lane_promote", "move a lane's due retries back to its stream",
             _k("lane-retry lane retries wake lanes"),
             (i("most"), LANE_MEMBER, WAKE_CAP, GROUP_ARG), reply="entries moved",
             roles=("worker", "reaper"), flags=("allow-oom",), lane_binds=((1, 2), (2, 2))),
    Contract("lane_reprioritize", "move a waiting small job to another priority's lane",
             _k("lane lane-retry lane lane-retry lanes ljobs retries wake"),
             (GROUP_ARG, LANE_MEMBER, replace(LANE_MEMBER, name="new lane member"),
              name("job id"), WAKE_CAP),
             reply="1 changed, 0 already, 2 held by a worker, 3 another lane",
             errors=("JOB_NOT_FOUND", "JOB_FINISHED"), roles=_A, flags=("allow-oom",),
             lane_binds=((1, 2), (2, 2), (3, 3), (4, 3))),
    Contract("lane_reclaim", "hand stalled small jobs to others or dead-letter them", _k(
        "lane ljobs lerrors lstarts lactive ldone events dead lresults lkept"),
             (*LANE_CTX, DEAD_CAP, tok("consumer"), ms("min idle"),
              Arg("cursor", "entry"), i("count", 1, 10_000), i("max deliveries override")),
             reply="{cursor, counts...}", roles=_R, flags=("allow-oom",), publishes=True),
    Contract("lane_requeue", "give back lane entries a worker will not run",
             _k("lane ljobs"), (GROUP_ARG, tok("consumer")), rest=(ENTRY,),
             reply="entries requeued", roles=_W, flags=("allow-oom",)),
    Contract("lane_start", "record the start of a suspect lane entry",
             _k("lane lstarts"), (ENTRY, tok("consumer")), reply="0|1", roles=_W,
             flags=("allow-oom",)),
    Contract("lane_submit", "submit small jobs into one lane",
             _k("lane lanes ljobs lactive wake"),
             (GROUP_ARG, LANE_MEMBER, WAKE_CAP, ms("retention"), i("max deliveries", 1)),
             rest=(name("job id"), KIND, PAYLOAD), tail=(TRACE,),
             reply="{clock, 1|0 per job}", roles=_P, lane_binds=((1, 2),)),
    Contract("lock", "take the reaper's lock", _k("reaper-lock"),
             (tok("holder"), ms("lifetime", lo=1)), reply="0|1", roles=_R,
             flags=("allow-oom",)),
    Contract("pause_queue", "pause a shard", _k("paused wake"), (tok("pause id"), WAKE_CAP),
             reply="0|1", roles=_A, flags=("allow-oom",)),
    Contract("promote_retries", "move a job's due retries back to its stream",
             _k("retry tasks meta"), (i("most"),), reply="{moved, next due}",
             roles=("worker", "reaper"), flags=("allow-oom",)),
    Contract("reap_leases", "return lapsed leases to ready", _k(
        "workers leased owners tokens ready wake reaping"),
             (WAKE_CAP, i("most"), ms("watched gap"), ms("grace")),
             reply="{leases returned, unwatched ms, dead workers...}", roles=_R,
             flags=("allow-oom",)),
    Contract("reclaim", "hand stalled entries to others or dead-letter them", _k(
        "tasks meta results errors inflight dlq unannounced"),
             (GROUP_ARG, tok("consumer"), ms("min idle"), Arg("cursor", "entry"),
              i("count", 1, 10_000), i("max deliveries override")),
             reply="{cursor, counts..., job_reply...}", roles=_R, flags=("allow-oom",)),
    Contract("record_start", "record the start of a suspect entry",
             _k("tasks inflight meta"), (ENTRY, tok("consumer")), reply="0|1", roles=_W,
             flags=("allow-oom",)),
    Contract("register_jobs", "register created jobs in their queue and add their tokens",
             _k("active finished tokens ready fair wake creating parked retries"), (WAKE_CAP,),
             rest=(name("job id"), PRIORITY, name("client"), CONCURRENCY,
                   tok("incarnation", empty=True), tok("dedup key", empty=True), ms("due")),
             reply="one code per job", roles=("producer", "reaper")),
    Contract("replay", "put a dead letter back into its (live) job", _k(
        "meta tasks errors dlq unannounced"),
             (i("index"), i("serial"), ms("job created", empty=True)), reply="1",
             errors=("JOB_NOT_FOUND", "JOB_FINISHED", "NOT_DEAD"), roles=_A),
    Contract("retry_job", "re-run a failed or partial job's dead letters in place, once",
             _k("meta tasks results errors dlq unannounced"),
             (GROUP_ARG, name("retry token")), rest=(i("index"),), least=1,
             reply="{put back, job_reply...}",
             errors=("JOB_NOT_FOUND", "NOT_FINISHED", "NOTHING_TO_RETRY"), roles=_A),
    Contract("replay_mark", "claim or complete the one replay of a dead letter",
             _k("replayed replayed-id"), (tok("replay token"), ms("lifetime", lo=1),
                                          name("target job", empty=True)),
             reply="the marker's value", roles=_A, flags=("allow-oom",)),
    Contract("repeat_advance", "move a repeat past the tick just submitted (compare and set)",
             _k("repeats repeat-next repeat-last"), (name("repeat"), ms("tick"), ms("next tick")),
             reply="0|1", errors=("TICK_PAST",), roles=_R),
    Contract("repeat_pause", "pause or resume a repeat", _k("repeats repeat-next"),
             (name("repeat"), enum("mode", "pause", "resume"), ms("next tick", empty=True)),
             reply="0|1", errors=("NO_REPEAT", "TICK_PAST"), roles=_P),
    Contract("repeat_remove", "remove a repeat (its jobs stay)",
             _k("repeats repeat-next repeat-last"), (name("repeat"),), reply="0|1", roles=_P,
             flags=("allow-oom",)),
    Contract("repeat_set", "add or replace a repeat and set its next tick",
             _k("repeats repeat-next repeat-last"),
             (name("repeat"), pat("spec", r"\{.*\}", "^{.*}$", "{...}", 64 * 1024),
              ms("first tick")),
             reply="1 added, 0 replaced", errors=("TICK_PAST",), roles=_P),
    Contract("reprioritize_job", "change a job's priority or concurrency in its meta",
             _k("meta"), (i("priority", 0, MAX_PRIORITY, empty=True),
                          i("concurrency", 1, MAX_CONCURRENCY, empty=True)),
             reply="job settings", errors=("JOB_NOT_FOUND", "JOB_FINISHED"), roles=_A, flags=("allow-oom",)),
    Contract("requeue", "give back entries a worker will not run", _k("tasks meta"),
             (GROUP_ARG, tok("consumer")), rest=(ENTRY,), reply="entries requeued", roles=_W,
             flags=("allow-oom",)),
    Contract("reserve_dedup", "reserve a dedup key for a job id", _k("dedup dedupx creating"),
             (tok("dedup key"), name("job id")), reply="the holder's job id", roles=_P),
    Contract("resume_queue", "resume a paused shard", _k("paused wake"), (WAKE_CAP,),
             reply="0|1", roles=_A, flags=("allow-oom",)),
    Contract("retoken", "re-score or re-count a job's tokens", _k(
        "tokens ready parked leased kick wake active"),
             (name("job id"), i("priority", 0, MAX_PRIORITY, empty=True),
              i("concurrency", 1, MAX_CONCURRENCY, empty=True), WAKE_CAP),
             reply="tokens changed", roles=_A, flags=("allow-oom",)),
    Contract("schedule_retry", "note a job's due retry in its queue", _k("retries"),
             (pat("job", _NAME + r"|rate\|" + _NAME + r"\|[0-9]{1,5}",
                  "^[%w_%.:%-]+$\n^rate|[%w_%.:%-]+|%d+$", "<job> or rate|<job>|<n>", 150),
              ms("delay")), reply="0|1", roles=_W, flags=("allow-oom",)),
    Contract("set_rate", "set or clear a rate limit", _k("rates buckets"),
             (pat("limit", r"queue|client:" + _NAME, "^queue$\n^client:[%w_%.:%-]+$",
                  "queue|client:<name>", 140),
              pat("rate", r"[0-9]{1,12}(?:\.[0-9]{1,9})?\|[0-9]{1,12}",
                  f"^{_D12}|{_D12}$\n^{_D12}%.{_D9}|{_D12}$", "<per second>|<burst>", 40,
                  empty=True)),
             reply="0|1", roles=_A, flags=("allow-oom",)),
    Contract("settle", "a slot's round: settle its tokens and claim new ones", _k(
        "ready leased owners tokens parked wake fair kick retries worker paused"),
             (tok("owner"), tok("call number"), ms("lease length", lo=1), i("claim", 0, 10_000),
              WAKE_CAP, ms("worker hash lifetime"), i("most due jobs")),
             rest=(TOKEN, enum("mode", "r", "p", "d")), reply="{claimed tokens, due jobs...}",
             roles=_W, flags=("allow-oom",)),
    Contract("take_permits", "take or give back rate-limit permits",
             _k("rates buckets"), rest=(name("client"), i("permits", -_N)),
             reply="permits granted per client", roles=_W, flags=("allow-oom",)),
    Contract("trim", "trim events, finished guards and dedup keys by Redis's clock",
             _k("events finished dedup dedupx"), (ms("events retention"), i("most")),
             reply="1 more is due, 0 done", roles=_R, flags=("allow-oom",)),
    Contract("unannounced", "list a job's dead letters not yet announced",
             _k("unannounced errors dlq meta"), (i("most"),), reply="dead letters",
             roles=("worker", "reaper"), flags=("allow-oom",)),
    Contract("unlock", "release the reaper's lock", _k("reaper-lock"), (tok("holder"),),
             reply="0|1", roles=_R, flags=("allow-oom",)),
    Contract("unpark", "send a job's parked tokens back to ready",
             _k("parked ready leased kick wake"), (name("job id"), CONCURRENCY, WAKE_CAP),
             reply="tokens unparked", roles=("producer", "worker", "reaper"),
             flags=("allow-oom",)),
    Contract("unregister", "remove a worker that stops", _k("workers worker"),
             (tok("worker id"),), reply="0|1", roles=_W, flags=("allow-oom",),
             key_of=((2, (1,)),)),
]

#: script name -> its contract
CONTRACTS: dict[str, Contract] = {c.name: c for c in _LIST}


def contract(script: str) -> Contract:
    """The contract of ``script``."""
    return CONTRACTS[script]
