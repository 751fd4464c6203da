"""Load streamq's Lua scripts, resolving ``--- @include`` lines.

Modelled on BullMQ's script loader. A script file is named
``<name>-<numkeys>.lua`` (``claim-6.lua``: script ``claim`` taking 6 KEYS). A
line ``--- @include "includes/foo"`` is replaced by the text of
``<root>/includes/foo.lua``; includes may include others. Each include is
emitted once per assembled script, the first time it is reached (depth
first), so a shared helper lands before its first user. With ``debug=True``
every emitted piece is preceded by a ``--- file: <relative path>`` line.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from streamq.errors import ScriptLoadError

__all__ = ["LuaScript", "assemble", "load_all", "load_script", "lua_dir", "parse_filename"]

_FILENAME_RE = re.compile(r"(?P<name>[a-z][a-z0-9]*(?:_[a-z0-9]+)*)-(?P<numkeys>[0-9]+)\.lua")
_INCLUDE_RE = re.compile(
    r"""^[ \t]*---[ \t]*@include[ \t]+(["'])(?P<target>[^"'\n]+)\1[ \t]*(?:\r?\n|\Z)""",
    re.MULTILINE,
)


@dataclass(frozen=True)
class LuaScript:
    """One assembled script, ready for ``SCRIPT LOAD`` / ``EVALSHA``."""

    name: str
    numkeys: int
    source: str
    path: Path


def lua_dir() -> Path:
    """Return the directory holding streamq's Lua scripts.

    ``<package>/lua`` when it exists (the wheel ships the scripts there),
    else the repository's top-level ``lua/`` (editable installs).
    """
    return _lua_dir_for(Path(__file__).resolve().parent.parent)


def _lua_dir_for(package_dir: Path) -> Path:
    shipped = package_dir / "lua"
    return shipped if shipped.is_dir() else package_dir.parent / "lua"


def parse_filename(filename: str) -> tuple[str, int]:
    """Split ``"claim-6.lua"`` into ``("claim", 6)``.

    Raises :class:`ScriptLoadError` unless the name is ``<snake_case>-<int>.lua``.
    """
    match = _FILENAME_RE.fullmatch(filename)
    if match is None:
        raise ScriptLoadError(
            f"bad Lua script filename {filename!r}: expected <snake_case_name>-<numkeys>.lua"
        )
    return match["name"], int(match["numkeys"])


def assemble(path: Path, root: Path, *, debug: bool = False) -> str:
    """Return the text of the script at *path* with every include expanded.

    Include targets are resolved relative to *root*. Raises
    :class:`ScriptLoadError` on a missing file, an include cycle or an include
    outside *root*; the message shows the include stack.
    """
    return "".join(_Assembler(root, debug).expand(path, []))


class _Assembler:
    """State of one :func:`assemble` call: which includes were already emitted."""

    def __init__(self, root: Path, debug: bool) -> None:
        self.root = root.resolve()
        self.debug = debug
        self.emitted: set[Path] = set()

    def label(self, path: Path) -> str:
        """Path relative to the root, in POSIX form (the file's own name if outside it)."""
        try:
            return path.resolve().relative_to(self.root).as_posix()
        except ValueError:
            return path.name

    def expand(self, path: Path, stack: list[tuple[Path, str]]) -> list[str]:
        """Return *path*'s text as pieces, its includes expanded in place."""
        path = path.resolve()
        rel = self.label(path)
        stack = [*stack, (path, rel.removesuffix(".lua"))]
        self.emitted.add(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ScriptLoadError(f"cannot read {rel}: {exc.strerror or exc}") from exc

        pieces: list[str] = []
        pos = 0
        for match in _INCLUDE_RE.finditer(text):
            self.emit(pieces, rel, text[pos : match.start()], first=pos == 0)
            pos = match.end()
            pieces.extend(self.include(match["target"], stack))
        self.emit(pieces, rel, text[pos:], first=pos == 0)
        return pieces

    def include(self, target: str, stack: list[tuple[Path, str]]) -> list[str]:
        """Expand one ``@include`` target, or nothing if it was already emitted."""
        chain = " -> ".join(label for _, label in stack)
        relative = target.strip()
        if not relative.endswith(".lua"):
            relative += ".lua"
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise ScriptLoadError(f"include {target!r} escapes {self.root} (in {chain})")
        if any(path == seen for seen, _ in stack):
            cycle = f"{chain} -> {self.label(path).removesuffix('.lua')}"
            raise ScriptLoadError(f"circular include: {cycle}")
        if path in self.emitted:
            return []
        if not path.is_file():
            raise ScriptLoadError(f"missing include {relative!r} (in {chain})")
        return self.expand(path, stack)

    def emit(self, pieces: list[str], rel: str, chunk: str, *, first: bool) -> None:
        """Append a chunk of one file's own text, with its debug marker."""
        if not first and not chunk.strip():
            return
        marker = f"--- file: {rel}\n"
        if self.debug and not (pieces and pieces[-1] == marker):
            pieces.append(marker)
        if chunk:
            pieces.append(chunk if chunk.endswith("\n") else chunk + "\n")


def load_script(path: Path, root: Path | None = None, *, debug: bool = False) -> LuaScript:
    """Load and assemble one script file; *root* defaults to its directory."""
    name, numkeys = parse_filename(path.name)
    source = assemble(path, path.parent if root is None else root, debug=debug)
    return LuaScript(name=name, numkeys=numkeys, source=source, path=path)


def load_all(root: Path | None = None, *, debug: bool = False) -> dict[str, LuaScript]:
    """Load every ``*.lua`` directly in *root* (default :func:`lua_dir`), keyed by name.

    Files under subdirectories such as ``includes/`` are not scripts. Raises
    :class:`ScriptLoadError` if two files share a script name.
    """
    root = lua_dir() if root is None else root
    if not root.is_dir():
        raise ScriptLoadError(f"Lua script directory {root} does not exist")
    scripts: dict[str, LuaScript] = {}
    for path in sorted(p for p in root.glob("*.lua") if p.is_file()):
        script = load_script(path, root, debug=debug)
        if script.name in scripts:
            other = scripts[script.name].path.name
            raise ScriptLoadError(f"two scripts named {script.name!r}: {other} and {path.name}")
        scripts[script.name] = script
    return scripts


@functools.cache
def bundled() -> dict[str, LuaScript]:
    """:func:`load_all` of the scripts shipped with streamq, assembled once per process
    (every client registers them: a Spark task, a producer, a worker slot)."""
    return load_all()


#: The Redis Functions library holding every streamq script (``FUNCTION LOAD``).
LIBRARY_NAME = "streamq"
#: A script ``ack`` is the function ``sq_ack`` of the library.
FUNCTION_PREFIX = "sq_"
#: Functions of the library that are not script files: its version and Redis's clock,
#: both read-only (``FCALL_RO``, any role).
VERSION_FUNCTION = FUNCTION_PREFIX + "version"
TIME_FUNCTION = FUNCTION_PREFIX + "time"


@dataclass(frozen=True)
class LuaLibrary:
    """Every streamq script as one Redis Functions library."""

    name: str
    #: the first 12 hex digits of the SHA-1 of the library's scripts: any change to
    #: any script is a new version
    version: str
    source: str
    #: script name -> function name
    functions: dict[str, str]


def function_name(script: str) -> str:
    """The library function that runs ``script``."""
    return FUNCTION_PREFIX + script


def guard_source(root: Path | None = None) -> str:
    """The library-level code every function shares: the guard that checks a call
    against its contract, and the publish helper (``lua/library/guard.lua``)."""
    root = lua_dir() if root is None else root
    return (root / "library" / "guard.lua").read_text(encoding="utf-8")


def build_library(scripts: dict[str, LuaScript], name: str = LIBRARY_NAME, *,
                  guarded: bool = True) -> LuaLibrary:
    """One library registering each script as a function whose body is the script:
    ``KEYS`` and ``ARGV`` are the callback's parameters, so a script runs as it would
    under EVAL. Includes are expanded into each function (no state is shared).

    Every function first runs the guard with its declared contract
    (:mod:`streamq.contracts`): a call whose keys or arguments do not fit is refused
    before anything is written. ``guarded=False`` leaves the check out (only the
    attack suite's self-test uses it, to show the suite would see what it stops)."""
    from streamq.storage.contracts import CONTRACTS  # the contracts name scripts: loaded after them

    missing = sorted(set(scripts) - set(CONTRACTS))
    if missing:
        raise ScriptLoadError(f"scripts without a declared contract: {', '.join(missing)}")
    bodies: list[str] = []
    specs: list[str] = []
    functions: dict[str, str] = {}
    for script in sorted(scripts.values(), key=lambda s: s.name):
        c = CONTRACTS[script.name]
        if c.numkeys != script.numkeys:
            raise ScriptLoadError(f"{script.path.name} takes {script.numkeys} keys, its "
                                  f"contract declares {c.numkeys}")
        fname = function_name(script.name)
        flags = ", ".join(f"'{f}'" for f in c.flags)
        specs.append(f"SQ_SPECS.{script.name} = {c.lua_spec()}\n")
        prologue = (f"local SQ_TAG, SQ_REFUSED = sq_guard(SQ_SPECS.{script.name}, KEYS, ARGV)\n"
                    "if not SQ_TAG then return SQ_REFUSED end\n" if guarded else
                    "local SQ_TAG = sq_tag_of(KEYS[1]) or ''\n")
        bodies.append(
            f"redis.register_function{{function_name='{fname}', "
            f"callback=function(KEYS, ARGV)\n{prologue}{script.source}end, flags={{{flags}}}}}\n")
        functions[script.name] = fname
    shared = guard_source() + "local SQ_SPECS = {}\n" + "".join(specs)
    version = hashlib.sha1((shared + "".join(bodies)).encode()).hexdigest()[:12]
    fixed = (
        f"redis.register_function{{function_name='{VERSION_FUNCTION}', "
        f"callback=function() return '{version}' end, flags={{'no-writes', 'allow-stale'}}}}\n"
        f"redis.register_function{{function_name='{TIME_FUNCTION}', "
        f"callback=function() return redis.call('TIME') end, "
        f"flags={{'no-writes', 'allow-stale'}}}}\n")
    source = f"#!lua name={name}\n" + shared + fixed + "".join(bodies)
    return LuaLibrary(name=name, version=version, source=source, functions=functions)


@functools.cache
def library() -> LuaLibrary:
    """:func:`build_library` of the scripts shipped with streamq (once per process)."""
    return build_library(bundled())
