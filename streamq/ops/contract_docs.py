"""The reference tables of docs/design/scripts.md, made from the scripts' declared contracts.

``python -m streamq.ops.contract_docs`` rewrites the tables between their markers in
docs/design/scripts.md; a test fails when the file holds anything else there.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from streamq.storage.contract import Arg, Contract, Counted
from streamq.storage.contracts import CONTRACTS
from streamq.storage.luaload import lua_dir

__all__ = ["error_codes", "error_table", "render", "script_table", "update"]

BEGIN = "<!-- generated from streamq/storage/contracts.py: {name} -->"
END = "<!-- end of generated {name} -->"


def _arg(a: Arg | Counted) -> str:
    if isinstance(a, Counted):
        return f"n, then n × ({', '.join(_arg(g) for g in a.group)})"
    return f"{a.name}: {a.describe()}"


def _args(c: Contract) -> str:
    parts = [f"{n}. {_arg(a)}" for n, a in enumerate(c.args, 1)]
    if c.rest:
        more = "one or more" if c.least else "any number of"
        parts.append(f"then {more} groups ({'; '.join(_arg(a) for a in c.rest)})")
    if c.tail:
        parts.append(f"then optionally ({'; '.join(_arg(a) for a in c.tail)})")
    return "<br>".join(parts).replace("|", "\\|") or "none"


def script_table() -> str:
    """One row per function: its slot, KEYS, ARGV, reply, errors, roles and flags."""
    rows = ["| function | slot | KEYS | ARGV | reply | errors | roles | flags |",
            "|---|---|---|---|---|---|---|---|"]
    for c in sorted(CONTRACTS.values(), key=lambda c: c.name):
        keys = "<br>".join(f"{n}. `{k.pattern}` {k.redis_type}"
                           for n, k in enumerate(c.keys, 1)).replace("|", "\\|")
        flags = [*c.flags, *(["publishes"] if c.publishes else [])]
        rows.append(
            f"| `sq_{c.name}` | {c.tag_class} | {keys} | {_args(c)} | "
            f"{c.reply.replace('|', chr(92) + '|')} | "
            f"{', '.join(c.errors) or '-'} | {', '.join(c.roles)} | {', '.join(flags) or '-'} |")
    return "\n".join(rows)


def error_codes() -> dict[str, tuple[int, str]]:
    """name -> (code, meaning) as lua/includes/errors.lua declares them."""
    text = (lua_dir() / "includes" / "errors.lua").read_text(encoding="utf-8")
    return {m[1]: (int(m[2]), m[3].strip())
            for m in re.finditer(r"local ERR_([A-Z_]+)\s*=\s*(-\d+)\s*--\s*(.*)", text)}


def error_table() -> str:
    """One row per error code: its name, meaning and the functions that return it."""
    rows = ["| code | name | meaning | returned by |", "|---|---|---|---|"]
    for name, (code, meaning) in sorted(error_codes().items(), key=lambda kv: -kv[1][0]):
        by = ", ".join(f"`{c.name}`" for c in sorted(CONTRACTS.values(), key=lambda c: c.name)
                       if name in c.errors)
        rows.append(f"| `{code}` | `ERR_{name}` | {meaning} | {by or '-'} |")
    return "\n".join(rows)


TABLES = {"script contracts": script_table, "error codes": error_table}


def render(text: str) -> str:
    """``text`` with each generated table between its markers made anew."""
    for name, make in TABLES.items():
        begin, end = BEGIN.format(name=name), END.format(name=name)
        if begin not in text or end not in text:
            raise ValueError(f"the text has no markers for the {name} table")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{make()}\n{end}{tail}"
    return text


def update(path: Path) -> bool:
    """Rewrite the generated tables of ``path``; True when anything changed."""
    old = path.read_text(encoding="utf-8")
    new = render(old)
    if new != old:
        path.write_text(new, encoding="utf-8")
    return new != old


if __name__ == "__main__":  # pragma: no cover - a maintainer's command
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/design/scripts.md")
    print(f"{target}: {'updated' if update(target) else 'up to date'}")
