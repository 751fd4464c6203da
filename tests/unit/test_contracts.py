"""Each script's one declared contract (streamq/storage/contracts.py) against everything said of it
elsewhere: the Lua header, the error codes, the roles, the doc tables. No server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from streamq.base.replies import ScriptErrorCode
from streamq.ops import contract_docs, roles
from streamq.storage.contract import Arg, Contract, ContractError, Counted
from streamq.storage.contracts import CONTRACTS, KINDS
from streamq.storage.luaload import build_library, bundled

SCRIPTS = bundled()
ROOT = Path(__file__).resolve().parents[2]


def _header(name: str) -> str:
    return re.sub(r"<[^<>\n]*>", "<>", SCRIPTS[name].source.split("]]", 1)[0])


def test_every_script_has_one_contract_with_its_key_count() -> None:
    assert set(CONTRACTS) == set(SCRIPTS)
    for name, lua in SCRIPTS.items():
        assert CONTRACTS[name].numkeys == lua.numkeys, name


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_lua_header_lists_the_declared_keys_and_arguments(name: str) -> None:
    c, head = CONTRACTS[name], _header(name)
    keys = re.findall(r"KEYS\[(\d+)\]\s+\S+\s+sq:\{<>(?:/<>)?\}:(\S+)\s+([A-Z]+)", head)
    assert [int(i) for i, _, _ in keys] == list(range(1, c.numkeys + 1))
    for (_, part, rtype), kind in zip(keys, c.keys):
        assert (part, rtype) == (re.sub(r"<[^>]*>", "<>", kind.pattern), kind.redis_type)
    if any(isinstance(a, Counted) for a in c.args):
        return  # heartbeat: its header counts sections by formula
    singles = sorted({int(n) for n in re.findall(r"ARGV\[(\d+)\]\s", head)})
    tail = [len(c.args) + 1] if c.tail and not c.rest else []
    assert singles == [*range(1, len(c.args) + 1), *tail]
    rest = re.findall(r"ARGV\[(\d+)\.\.\]", head)
    assert [int(r) for r in rest] == ([len(c.args) + 1] if c.rest else [])


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_declared_error_codes_are_the_ones_the_script_returns(name: str) -> None:
    source = re.sub(r"local ERR_[A-Z_]+ = -\d+.*", "", SCRIPTS[name].source)
    assert set(re.findall(r"\bERR_([A-Z_]+)\b", source)) == set(CONTRACTS[name].errors)


def test_error_codes_of_lua_and_python_agree() -> None:
    lua = {name: code for name, (code, _) in contract_docs.error_codes().items()}
    assert lua == {e.name: int(e) for e in ScriptErrorCode}
    assert {e for c in CONTRACTS.values() for e in c.errors} <= set(lua)


def test_a_function_publishes_only_where_its_contract_says_so() -> None:
    for name, lua in SCRIPTS.items():
        if CONTRACTS[name].publishes:
            assert "sq_publish(" in lua.source, name
        body = re.sub(r"--\[\[.*?\]\]|--[^\n]*", "", lua.source, flags=re.DOTALL)
        # every command a function runs is written in its code, never an argument
        # (chunked's `cmd` is a literal at each call; copy_entry's args start with "XADD")
        body = body.replace("rcall(cmd, key,", "").replace('args = {"XADD"', "")
        body = body.replace("rcall(unpack(args))", "")
        assert not re.search(r"\b(rcall|redis\.p?call)\(\s*[^\s\"']", body), name
        for call in re.finditer(r"(?<!function )\bchunked\(\s*(.)", body):
            assert call[1] in "\"'", name
        assert '"PUBLISH"' not in body.upper().replace("SPUBLISH", ""), name


def test_roles_come_from_the_contracts() -> None:
    for role in ("producer", "worker", "reaper", "inspector"):
        declared = {c.name for c in CONTRACTS.values() if role in c.roles}
        assert roles.FUNCTIONS[role] == declared
        rules = roles.acl_rules(role)
        assert {m for m in re.findall(r"\+sq\.fcall\|sq_(\w+)", rules)} == declared
    admin_only = {c.name for c in CONTRACTS.values() if c.roles == ("admin",)}
    assert admin_only == {"pause_queue", "resume_queue", "replay", "replay_mark",
                          "reprioritize_job", "retoken", "set_rate", "delete_job",
                          "lane_delete", "retry_job", "lane_retry", "lane_reprioritize"}


def test_the_design_docs_tables_are_made_from_the_contracts() -> None:
    text = (ROOT / "docs" / "design" / "scripts.md").read_text(encoding="utf-8")
    assert contract_docs.render(text) == text, "run: python -m streamq.ops.contract_docs"


def test_every_function_runs_the_guard_first_and_takes_no_command_from_its_caller() -> None:
    source = build_library(SCRIPTS).source
    for name in SCRIPTS:
        at = source.index(f"function_name='sq_{name}'")
        assert f"sq_guard(SQ_SPECS.{name}, KEYS, ARGV)" in source[at:at + 300]
    unguarded = build_library(SCRIPTS, guarded=False).source
    assert "sq_guard(SQ_SPECS" not in unguarded


@pytest.mark.parametrize(("arg", "good", "bad"), [
    (Arg("n", "int", lo=0, hi=99), ["0", "99", 7], ["-1", "100", "1.5", "", "1e3", "SET",
                                                    "9" * 16]),
    (Arg("n", "int", lo=-1, hi=5, empty=True), ["-1", ""], ["-2", "+1", " 1"]),
    (Arg("e", "enum", values=("r", "p")), ["r", "p"], ["", "R", "rp", "SET"]),
    (Arg("j", "name"), ["job-1", "a.b:c_d"], ["", "a b", "sq:{x}:meta", "x" * 129, "é"]),
    (Arg("t", "token", size=8), ["ab|c~d", "a/b#1"], ["", "a b", "{x}", "x" * 9]),
    (Arg("x", "entry"), ["0-0", "1795627741016-3"], ["", "1-", "a-1", "1-2-3"]),
    (Arg("b", "text", size=4), ["", "abcd", b"\x00\xff"], ["abcde"]),
    (Arg("u", "text", size=8, utf8=True), ["", "é☃", "a\x00", "𝄞"],
     ["x" * 9, b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x98", b"\xf4\x90\x80\x80"]),
])
def test_argument_types(arg: Arg, good: list[object], bad: list[object]) -> None:
    for v in good:
        assert arg.ok(v), v
    for v in bad:
        assert not arg.ok(v), v


def test_the_python_check_refuses_keys_of_another_tag_kind_or_prefix() -> None:
    c = CONTRACTS["abort_job"]
    keys = [f"sq:{{q/job-1}}:{k.name}" for k in c.keys]
    assert c.check(keys, ["why", "", ""]) == "q/job-1"
    for i, bad in [(2, "sq:{q/job-2}:tasks"), (2, "sq:{r/job-1}:tasks"), (2, "sq:{q/job-1}:dead"),
                   (1, "foo"), (3, "victim"), (1, "sq:{a b}:meta"), (1, "sq:{q~1}:meta"),
                   (1, "sq:{job-1}:meta"), (1, "sq:{q/a/b}:meta"), (1, "sq:{/job-1}:meta")]:
        with pytest.raises(ContractError):
            c.check([*keys[:i - 1], bad, *keys[i:]], ["why", "", ""])
    with pytest.raises(ContractError):
        c.check(keys[:-1], ["why", "", ""])
    with pytest.raises(ContractError):
        c.check(keys, ["why", "", "", "extra"])
    heartbeat = CONTRACTS["heartbeat"]
    hk = ["sq:{q~2}:workers", "sq:{q~2}:worker:w1", "sq:{q~2}:leased", "sq:{q~2}:owners",
          "sq:{q~2}:stats"]
    args = ["w1", 1, 1, 1, "", 1, 1, "started", 3, 1, "host", "h", "j#0", "w1/0"]
    assert heartbeat.check(hk, args) == "q~2"
    with pytest.raises(ContractError):  # another worker's hash
        heartbeat.check([hk[0], "sq:{q~2}:worker:w2", *hk[2:]], args)
    with pytest.raises(ContractError):  # a count that runs past the end
        heartbeat.check(hk, [*args[:6], 9, *args[7:]])


def test_every_key_kind_is_used_and_of_one_slot_class() -> None:
    used = {k.name for c in CONTRACTS.values() for k in c.keys}
    assert used == set(KINDS)
    for c in CONTRACTS.values():
        assert len({k.slot == "job" for k in c.keys}) == 1, c.name


def test_a_function_that_names_no_keys_is_refused_at_its_declaration() -> None:
    # (the guard's checks start from KEYS[1]'s tag: lua/library/guard.lua)
    with pytest.raises(ValueError, match="names the keys it touches"):
        Contract("keyless", "touch nothing", ())
