"""The invariants a chaos run must end with, checked on Redis and on the handlers' logs.

Every job of the queue in Redis (found by SCAN of ``sq:{<queue>/*}:meta``, so jobs of an
interrupted ``submit_many`` count too, and in each shard's ``ljobs``: the small
jobs of the lane) and every job a producer confirmed:

- terminal (``stuck`` otherwise, with its meta, stream and registry state);
- every sub-request 0..total-1 has a stored result or a dead letter, not both
  (``losses``, ``both``); a result is what the handler returns for that
  payload; a poison payload never has a result (``wrong results``);
- ``done`` = stored results, ``failed`` = dead letters, ``total`` = the
  sub-requests the producer added (``double counts``);
- exactly one completion record in ``events`` (``missing``/``double
  completions``), whose counts are the job's final ones (``premature``), at
  most one publication (none only while the subscriber was reconnecting; two
  when Redis, SIGKILLed right after the first, lost its writes and the job
  completed again: ``completions published again after a Redis crash``);
- handler starts per sub-request at most ``(replays + 1) * (max_deliveries + 1)``
  (``past max_deliveries``); successful runs beyond the first are
  ``duplicates run`` (allowed: delivery is at least once);
- each dead letter announced in the queue's ``dead`` stream exactly once (none
  when it was replayed into another job);
- no key of the job without a TTL; no token of it left in the queue slot;
- a dedup key made one job;
- no job ever ran more handlers at once than its concurrency in force, by the
  handlers' own start and end records, outside the design's exceptions
  (``cap exceeded``: overlap.py);
- a run that went on past its job's timeout never had its late value stored
  (``late results stored``);
- a cancel resent after its lost reply reports what the first call did: the job
  ends cancelled exactly when it says it cancelled it, in the state it reports
  (``cancel misreported``).
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from streamq.base.codec import decode_result
from streamq.base.keys import JobKeys, QueueKeys
from streamq.base.members import owner_worker, token_job
from streamq.producer import lane

from .handler import expected
from .load import Ledger, Subscriber
from .overlap import Caps, Liveness, check_caps, read_records

TERMINAL = {"succeeded", "partial", "failed", "aborted", "cancelled"}
#: states in which a sub-request may end with neither a result nor a dead letter
STOPPED = {"aborted", "cancelled"}


@dataclass
class Runs:
    """What the handlers' logs say about one sub-request."""

    starts: int = 0
    ok: int = 0
    raised: int = 0
    late: int = 0  # returned past the job's timeout (the worker had given them up)
    by_attempt: Counter[int] = field(default_factory=Counter)  # starts per attempt number

    def describe(self) -> str:
        per = ", ".join(f"attempt {a}: {n}" for a, n in sorted(self.by_attempt.items()))
        return (f"starts by attempt ({per}); {self.raised} raised, {self.ok} returned, "
                f"{self.late} returned late, "
                f"{self.starts - self.ok - self.raised - self.late} cut short by a process death")


def read_runs(workdir: Path) -> dict[tuple[str, int], Runs]:
    runs: dict[tuple[str, int], Runs] = defaultdict(Runs)
    for name in os.listdir(workdir):
        if not name.startswith("runs-"):
            continue
        for line in (workdir / name).read_text().splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue
            r = runs[(parts[1], int(parts[2]))]
            if parts[0] == "S":
                r.starts += 1
                if len(parts) > 3:
                    r.by_attempt[int(parts[3])] += 1
            elif parts[0] == "E":
                r.ok += 1
            elif parts[0] == "F":
                r.raised += 1
            elif parts[0] == "L":
                r.late += 1
    return runs


@dataclass
class Findings:
    counts: Counter[str] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    details: list[str] = field(default_factory=list)
    #: each job's concurrency over time (overlap.Caps spans), kept for findings.json
    caps: dict[str, Any] = field(default_factory=dict)

    def bad(self, kind: str, detail: str, n: int = 1) -> None:
        self.violations[kind] += n
        if len(self.details) < 400:
            self.details.append(f"{kind}: {detail}")


#: the most a SIGKILLed redis-server with appendfsync everysec may lose: the last second
#: of writes, or two while a slow fsync postpones its AOF writes
CRASH_LOSS_S = 2.0


def redone_after_crash(published_ms: int, recorded_ms: int, crashes: list[float]) -> bool:
    """Whether a completion published at ``published_ms`` (Redis's clock) and recorded,
    in the one record that survived, at ``recorded_ms`` is the same completion done
    twice across a SIGKILL of Redis at one of ``crashes`` (epoch seconds) that lost the
    first's writes: published in the moment before the crash, recorded after it."""
    return any(at * 1000 - CRASH_LOSS_S * 1000 <= published_ms <= at * 1000 < recorded_ms
               for at in crashes)


def lost_in_crash(confirmed_at: float, crashes: list[float]) -> bool:
    """Whether a write confirmed at ``confirmed_at`` (epoch seconds) fell in the last
    writes a SIGKILL of Redis at one of ``crashes`` may lose (CRASH_LOSS_S before it; a
    reply sent just before the kill may be read up to a second after it)."""
    return any(at - CRASH_LOSS_S <= confirmed_at <= at + 1.0 for at in crashes)


def finished_past_a_lost_write(confirmed_at: float, finished_ms: list[int],
                               crashes: list[float]) -> bool:
    """Whether a job that is not terminal in its own slot while its queue's ``events``
    record its completion (at ``finished_ms``, Redis's clock) is explained by a SIGKILL
    of Redis that lost its own slot's last write: the job was confirmed in the writes
    that crash may lose, and the completion was recorded after the crash."""
    return bool(finished_ms) and any(
        at - CRASH_LOSS_S <= confirmed_at <= at + 1.0 and min(finished_ms) > at * 1000
        for at in crashes)


def open_past_a_lost_finalize(state: str, finalized: bool, finalized_at: float,
                              crashes: list[float]) -> bool:
    """Whether a job still ``open`` is explained by a SIGKILL of Redis that lost the
    finalize its producer saw return at ``finalized_at`` (epoch seconds): the write fell
    in the last writes the crash may lose (appendfsync everysec sends a reply before a
    postponed AOF write). A job its producer never finalized is not explained."""
    return state == "open" and finalized and lost_in_crash(finalized_at, crashes)


def late_value(value: Any) -> bool:
    """Whether a stored result is what a run returned past its timeout (handler.late)."""
    return isinstance(value, dict) and bool(value.get("late"))


def cancel_misreported(cancelled: bool, said: str, ended: str) -> bool:
    """Whether a cancel's report (``cancelled``, state ``said``) contradicts how its job
    ``ended``: the one cancel sent to the job cancelled it exactly when the job ended
    cancelled, and the state it reports is the job's last."""
    return cancelled != (ended == "cancelled") or said != ended


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def job_ids_in_redis(r: redis.Redis, queue: str,
                     tags: list[str] | None = None) -> dict[str, dict[str, str]]:
    """Every job of the queue (its meta names one of the queue's shard tags)."""
    mine = set(tags or [queue])
    out: dict[str, dict[str, str]] = {}
    for key in r.scan_iter(match=f"sq:{{{queue}/*}}:meta", count=1000):
        k = _s(key)
        jid = k[len(f"sq:{{{queue}/"):-len("}:meta")]
        meta = {_s(a): _s(b) for a, b in r.hgetall(k).items()}  # type: ignore[union-attr]
        if meta.get("queue") in mine:
            out[jid] = meta
    return out


def lane_jobs(r: redis.Redis, shards: list[QueueKeys]) -> dict[str, dict[str, str]]:
    """Every small job (streamq.lane) of the queue's shards, its record read as a meta
    (``lane`` names the shard tag)."""
    out: dict[str, dict[str, str]] = {}
    for qk in shards:
        for jid, raw in r.hscan_iter(qk.ljobs, count=1000):
            rec = lane.parse(raw, qk.tag)
            meta = {k: str(v) for k, v in rec.items()}
            meta.update(total="1", lane=qk.tag)
            out[_s(jid)] = meta
    return out


def _dead_at(r: redis.Redis, jk: JobKeys, idx: str) -> str:
    raw = r.hget(jk.errors, idx)
    try:
        return str(json.loads(raw)["at"]) if raw else "?"  # type: ignore[arg-type]
    except (ValueError, KeyError):
        return "?"


def _token_places(r: redis.Redis, qk: QueueKeys, jid: str) -> list[str]:
    out = []
    for t in (_s(x) for x in r.hkeys(qk.tokens)):  # type: ignore[union-attr]
        if token_job(t) != jid:
            continue
        where = [name for name, key in (("ready", qk.ready), ("leased", qk.leased),
                                        ("parked", qk.parked))
                 if r.zscore(key, t) is not None]
        owner = r.hget(qk.owners, t)
        if owner is not None:
            alive = r.zscore(qk.workers, owner_worker(_s(owner))) is not None
            where.append(f"owner {_s(owner)} ({'registered' if alive else 'gone'})")
        out.append(f"{t.rsplit('#', 1)[1]}:{'+'.join(where) or 'nowhere'}")
    return out


def _stuck_detail(r: redis.Redis, qk: QueueKeys, jid: str, meta: dict[str, str]) -> str:
    """One line saying where a job that never finished is stuck."""
    jk = qk.job(jid)
    fields = {k: meta.get(k) for k in ("state", "total", "remaining", "done", "failed", "mode")}
    xlen = int(r.xlen(jk.tasks))
    why = ""
    pending: Any = 0
    try:
        if r.exists(jk.tasks):
            pending = r.xpending(jk.tasks, "workers")["pending"]
            group = next((g for g in r.xinfo_groups(jk.tasks)  # type: ignore[union-attr]
                          if _s(g["name"]) == "workers"), None)
            last = r.xrevrange(jk.tasks, count=1)
            if group and last and xlen > int(pending):
                newest = _s(last[0][0])  # type: ignore[index]
                delivered = _s(group["last-delivered-id"])
                if tuple(map(int, delivered.split("-"))) >= tuple(map(int, newest.split("-"))):
                    why = (f" DELIVERED ENTRIES LOST FROM THE PEL: {xlen - int(pending)} entries "
                           f"up to {newest} were read (last-delivered-id {delivered}) but are "
                           f"no longer pending: a consumer holding them was deleted")
    except redis.ResponseError:
        pending = "no group"
    if meta.get("state") == "open":
        why += " (never finalized)"
    return (f"job {jid} {fields} xlen={xlen} pending={pending} retry={r.zcard(jk.retry)} "
            f"inflight={r.hlen(jk.inflight)} registered={r.zscore(qk.active, jid) is not None} "
            f"tokens={_token_places(r, qk, jid)}{why}")


def check(r: redis.Redis, queue: str, tags: list[str], ledger: Ledger, sub: Subscriber,
          workdir: Path, deaths: dict[int, list[int]] | None = None,
          outages: list[tuple[int, int]] | None = None,
          lifetime_ns: int = 900_000_000, crashes: list[float] | None = None) -> Findings:
    """Every invariant; ``deaths`` (pid -> ns of deaths), ``outages`` (Redis away for everyone,
    ns) and ``lifetime_ns`` (a worker's registration) for the concurrency check."""
    f = Findings()
    shards = [QueueKeys(queue, t) for t in tags]
    metas = job_ids_in_redis(r, queue, tags)
    metas.update(lane_jobs(r, shards))
    runs = read_runs(workdir)
    events: dict[str, list[dict[str, str]]] = defaultdict(list)
    dead: Counter[tuple[str, str]] = Counter()
    for qk in shards:
        for eid, e in r.xrange(qk.events):  # type: ignore[union-attr]
            d = {_s(a): _s(b) for a, b in e.items()}
            d["redis_ms"] = _s(eid).split("-")[0]  # the entry id is Redis's clock
            events[d["job"]].append(d)
        for _id, e in r.xrange(qk.dead):  # type: ignore[union-attr]
            dead[(_s(e[b"job"]), _s(e[b"index"]))] += 1

    for jid, rec in ledger.jobs.items():
        if jid not in metas and rec.confirmed:
            if lost_in_crash(rec.confirmed_at, crashes or []):
                # created in the moment before a SIGKILL of Redis that lost its last
                # writes (appendfsync everysec): the documented durability limit
                f.counts["jobs lost with Redis's last writes in a crash"] += 1
                continue
            f.bad("lost jobs", f"{rec.kind} job {jid} confirmed by its producer is not in Redis")
    f.counts["jobs"] = len(metas)
    for meta in metas.values():
        f.counts[f"jobs on {meta.get('queue')}"] += 1
    f.counts["unknown jobs"] = len(set(metas) - set(ledger.jobs))
    for rec in ledger.jobs.values():
        if rec.job_id in metas:
            f.counts[f"jobs {rec.kind}"] += 1

    for jid, meta in metas.items():
        rec = ledger.jobs.get(jid)
        state = meta.get("state", "?")
        total, done, failed = (int(meta.get(k, -1)) for k in ("total", "done", "failed"))
        f.counts["sub-requests"] += total
        if state not in TERMINAL:
            if rec is not None and open_past_a_lost_finalize(
                    state, rec.finalized, rec.finalized_at, crashes or []):
                # its finalize returned in the moment before a SIGKILL of Redis that lost
                # Redis's last writes (appendfsync everysec): the durability limit
                f.counts["jobs whose finalize Redis lost in a crash"] += 1
                continue
            if rec is not None and finished_past_a_lost_write(
                    rec.confirmed_at, [int(e["redis_ms"]) for e in events[jid]], crashes or []):
                # its own slot's last write (a cancel's, an ack's) was lost with Redis's
                # last writes in a crash, and the step that followed it, the finish in
                # the queue's slot, went through after the restart: the documented
                # durability limit (appendfsync everysec), not a stuck job of streamq's
                f.counts["jobs whose own last write Redis lost in a crash"] += 1
                continue
            detail = (f"small job {jid} {meta}" if meta.get("lane") else
                      _stuck_detail(r, QueueKeys(queue, meta["queue"]), jid, meta))
            if state == "open" and rec is not None and not rec.finalized:
                detail += " (its producer never finalized it)"
            elif state == "open" and rec is not None:
                detail += f" (its producer's finalize returned at {rec.finalized_at:.3f})"
            f.bad("stuck jobs", detail)
            continue
        f.counts[f"state {state}"] += 1
        jk = JobKeys(jid, queue)
        if meta.get("lane"):
            lqk = QueueKeys(queue, meta["lane"])
            kept: Any = r.hget(lqk.ljobs, jid)  # a job that succeeded: its result in it
            result: Any = (lane.result_of(kept) if kept is not None else None) or r.hget(
                lqk.lresults, jid)
            results = {} if result is None else {0: result}
            errors = {"0"} if r.hexists(lqk.lerrors, jid) else set()
        else:
            results = {int(_s(k)): v for k, v in r.hgetall(jk.results).items()}  # type: ignore[union-attr]
            errors = {_s(k) for k in r.hkeys(jk.errors)}  # type: ignore[union-attr]
        f.counts["results"] += len(results)
        f.counts["dead letters"] += len(errors)
        for i in range(total):
            has_r, has_e = i in results, str(i) in errors
            if not has_r and not has_e and state not in STOPPED:
                f.bad("losses", f"job {jid} sub-request {i}: no result, no dead letter")
            elif has_r and has_e:
                f.bad("result and dead letter", f"job {jid} sub-request {i}")
        extra = [i for i in results if not 0 <= i < total]
        if extra:
            f.bad("double counts", f"job {jid}: results for indexes {extra} past total {total}")
        if done != len(results) or failed != len(errors):
            f.bad("double counts", f"job {jid}: done={done} failed={failed} but "
                                   f"{len(results)} results, {len(errors)} dead letters")
        if state == "cancelled" and (rec is None or not rec.cancel_sent):
            f.bad("unexpected cancels", f"job {jid} ended cancelled; no cancel was sent")
        if rec is not None and rec.cancel_report is not None:
            stage, cancelled, said = rec.cancel_report
            if cancel_misreported(cancelled, said, state):
                f.bad("cancel misreported", f"job {jid} ({stage}, resent after a lost reply) "
                                            f"reported cancelled={cancelled} state {said}; "
                                            f"it ended {state}")
        if state not in STOPPED and done + failed != total:
            f.bad("double counts", f"job {jid}: done {done} + failed {failed} != total {total}")
        if rec is not None:
            decoded = {i: decode_result(raw) for i, raw in results.items()}
            by_uid = {p["u"]: p for p in rec.payloads if "u" in p}
            if total != len(rec.payloads):
                uids = Counter(v.get("u") for v in decoded.values() if isinstance(v, dict))
                twice = sorted(str(u) for u, n in uids.items() if n > 1)
                f.bad("double counts", f"{rec.kind} job {jid}: total {total}, the producer "
                                       f"added {len(rec.payloads)}; sub-requests stored twice "
                                       f"under two indexes: {twice}")
            for i, got in list(decoded.items()):
                if late_value(got):
                    f.bad("late results stored", f"job {jid} sub-request {i}: {got!r}, "
                                                 "returned after its timeout")
                    del decoded[i]
            for i, got in decoded.items():
                # by index when the totals agree, else by the payload's uid
                p = rec.payloads[i] if total == len(rec.payloads) and i < len(rec.payloads) \
                    else by_uid.get(got.get("u") if isinstance(got, dict) else None, {})
                if p.get("m") == "poison" or not p or got != expected(p):
                    f.bad("wrong results", f"job {jid} sub-request {i}: {got!r} for {p!r}")

        # completion: one record, the final counts, at most one publication
        evs = events.get(jid, [])
        if not evs:
            f.bad("missing completions", f"job {jid} ({state}) has no completion record")
        elif len(evs) > 1:
            f.bad("double completions", f"job {jid} has {len(evs)} completion records")
        for e in evs:
            if state == "cancelled" and e["state"] == state and int(e["total"]) == total \
                    and int(e["done"]) <= done and int(e["failed"]) <= failed:
                continue  # what ran at the cancel stores its result after the record
            if (e["state"], int(e["total"]), int(e["done"]), int(e["failed"])) != (
                    state, total, done, failed):
                f.bad("premature completions",
                      f"job {jid} completed as {e['state']} total={e['total']} "
                      f"done={e['done']} failed={e['failed']}; it ended {state} total={total} "
                      f"done={done} failed={failed}")
        pubs = sub.pubs.get(jid, [])
        if len(pubs) == 2 and len(evs) == 1 and redone_after_crash(
                int(pubs[0]["finished_ms"]), int(evs[0]["redis_ms"]), crashes or []):
            # its completion was published, then lost with Redis's last writes, and
            # done again: the durability limit of appendfsync everysec, not a defect
            f.counts["completions published again after a Redis crash"] += 1
        elif len(pubs) > 1:
            f.bad("double completions", f"job {jid} published {len(pubs)} times")
        elif not pubs:
            # with one record, its id dates the publication on Redis's clock
            if evs and sub.missed(int(evs[0]["redis_ms"])):
                f.counts["publications missed while resubscribing"] += 1
            elif evs:
                f.bad("missing publications",
                      f"job {jid} recorded at {evs[0]['redis_ms']} ms (Redis clock), never "
                      f"published while subscribed (gaps {sub.gaps})")
        for p in pubs:
            if state == "cancelled" and p["state"] == state and p["total"] == total \
                    and p["done"] <= done and p["failed"] <= failed:
                continue
            if (p["state"], p["total"], p["done"], p["failed"]) != (state, total, done, failed):
                f.bad("premature completions", f"job {jid} published {p}; it ended {state} "
                                               f"total={total} done={done} failed={failed}")

        # deliveries
        md = int(meta.get("max_deliveries") or 0) or (rec.max_deliveries if rec else 5)
        for i in range(total):
            run = runs.get((jid, i))
            if run is None:
                continue
            f.counts["handler runs"] += run.starts
            f.counts["runs cut short"] += max(0, run.starts - run.ok - run.raised)
            f.counts["duplicates run"] += max(0, run.ok - 1)
            replayed = 1 if (jid, i) in ledger.replays else 0
            bound = (replayed + 1) * (md + 1)
            if run.starts > bound:
                f.bad("past max_deliveries", f"job {jid} sub-request {i} started {run.starts} "
                                             f"times (max_deliveries {md}, replays {replayed}): "
                                             f"{run.describe()}")

        # dead letters announced once (none when replayed into another job)
        for idx in errors:
            target = ledger.replays.get((jid, int(idx))) if idx.isdigit() else None
            if target == "":
                f.counts["dead letters of failed replays (unchecked)"] += 1
                continue
            want = 0 if target not in (None, jid) else 1
            got_n = dead[(jid, idx)]
            if got_n != want:
                kind = "dead letters unannounced" if got_n < want else "dead letters twice"
                why = (f"replayed into job {target}, so the replay deleted one copy"
                       if want == 0 else "never replayed")
                pending = r.sismember(jk.unannounced, idx)
                f.bad(kind, f"job {jid} index {idx}: {got_n} in the dead stream, want {want} "
                            f"({why}; still in unannounced: {bool(pending)}; dead-lettered at "
                            f"{_dead_at(r, jk, idx)} ms)")

        # no key of the job without a TTL
        for key in r.scan_iter(match=f"sq:{{{queue}/{jid}}}:*", count=1000):
            if r.ttl(key) == -1:
                f.bad("keys without TTL", f"{_s(key)} ({state} job)")

    # no queue shard keeps anything of terminal jobs
    live = {j for j, m in metas.items() if m.get("state") not in TERMINAL}
    for qk in shards:
        for key in (qk.tokens, qk.owners, qk.kick):
            for t in r.hkeys(key):  # type: ignore[union-attr]
                if token_job(_s(t)) not in live:
                    f.bad("tokens left", f"{key} holds {_s(t)}")
        for key in (qk.ready, qk.leased, qk.parked):
            for t in r.zrange(key, 0, -1):  # type: ignore[union-attr]
                if token_job(_s(t)) not in live:
                    f.bad("tokens left", f"{key} holds {_s(t)}")
        registered = [*r.zrange(qk.active, 0, -1), *r.zrange(qk.lactive, 0, -1)]  # type: ignore[misc]
        for jid in (_s(j) for j in registered):
            if jid not in live:
                f.bad("stuck jobs", f"{jid} still registered in {qk.tag}'s active (state "
                                    f"{metas.get(jid, {}).get('state', 'gone')})")

    # dedup: one job per key
    dedup_jobs: dict[str, set[str]] = defaultdict(set)
    for jid, meta in metas.items():
        if meta.get("dedup"):
            dedup_jobs[meta["dedup"]].add(jid)
    for key, ids in ledger.dedup_ids.items():
        made = ids | dedup_jobs.get(key, set())
        if len(made) != 1:
            f.bad("dedup made two jobs", f"key {key}: jobs {sorted(made)}")
    f.counts["dedup keys"] = len(ledger.dedup_ids)
    check_concurrency(f, metas, ledger, workdir, deaths or {}, outages or [], lifetime_ns)
    return f


def check_concurrency(f: Findings, metas: dict[str, dict[str, str]], ledger: Ledger,
                      workdir: Path, deaths: dict[int, list[int]],
                      outages: list[tuple[int, int]],
                      lifetime_ns: int) -> None:
    """Invariant 5 on the handlers' records (overlap.py): ``cap exceeded``."""
    rec = read_records(workdir, deaths)
    caps: dict[str, Caps] = {}
    totals: dict[str, int] = {}
    for jid, meta in metas.items():
        job = ledger.jobs.get(jid)
        first = (job.concurrency if job is not None and job.concurrency
                 else int(meta.get("concurrency") or 1))
        caps[jid] = c = Caps(first)
        for to, sent, returned in (job.caps if job is not None else []):
            c.change(to, sent, returned)
        totals[jid] = int(meta.get("total") or 0) or 1 << 30
    f.caps = {j: c.spans for j, c in caps.items()}
    alive = Liveness(rec.beats, lifetime_ns, outages)
    f.counts["timed runs"] = len(rec.runs)
    excused: Counter[str] = Counter()
    for line in check_caps(rec.runs, caps, totals, alive, excused):
        f.bad("cap exceeded", line)
    for why, n in excused.items():
        f.counts[f"overlaps excused: {why}"] = n


def summarize_unexpected(detail: str, tail: str) -> str:
    lines = [ln for ln in tail.splitlines() if ln.strip()]
    last = lines[-1] if lines else "(no output)"
    return f"{detail}: {last[:160]}"


def dump(path: Path, findings: Findings, extra: dict[str, Any]) -> None:
    """Write every finding (not only the first screen) as JSON for later reading."""
    path.write_text(json.dumps({"counts": findings.counts, "violations": findings.violations,
                                "details": findings.details, **extra, "caps": findings.caps},
                               indent=1, default=str))
