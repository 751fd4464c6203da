"""Tests of streamq.luaload: script file names, include expansion, debug markers.

Pure: no Redis. Fixtures live in tests/fixtures/scripts/; the scripts that must
fail to load sit in its broken/ subdirectory so that load_all() on the fixture
root only sees the good ones.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from streamq.errors import ScriptLoadError
from streamq.storage.luaload import (
    LuaScript,
    _lua_dir_for,
    assemble,
    load_all,
    load_script,
    lua_dir,
    parse_filename,
)

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"
BROKEN = ROOT / "broken"


def functions(source: str) -> list[str]:
    """Names of the ``local function``s in *source*, in order."""
    return re.findall(r"^local function (\w+)\(", source, flags=re.MULTILINE)


def include_lines(source: str) -> list[str]:
    return [line for line in source.splitlines() if "@include" in line]


# -- file names ------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "expected"),
    [
        ("claim-6.lua", ("claim", 6)),
        ("add_job-0.lua", ("add_job", 0)),
        ("move_to_finished-12.lua", ("move_to_finished", 12)),
        ("v2-3.lua", ("v2", 3)),
    ],
)
def test_parse_filename(filename: str, expected: tuple[str, int]) -> None:
    assert parse_filename(filename) == expected


@pytest.mark.parametrize(
    "filename",
    [
        "BadName.lua",  # the fixture in broken/
        "claim.lua",  # no numkeys
        "claim-6.txt",
        "claim-6.lua.bak",
        "claim--1.lua",  # negative
        "claim-x.lua",
        "Claim-6.lua",  # not snake_case
        "add-job-2.lua",
        "add__job-2.lua",
        "_claim-2.lua",
        "claim_-2.lua",
        "-2.lua",
        "",
    ],
)
def test_parse_filename_rejects_bad_names(filename: str) -> None:
    with pytest.raises(ScriptLoadError, match="filename"):
        parse_filename(filename)


def test_load_script_rejects_bad_filename() -> None:
    with pytest.raises(ScriptLoadError, match="BadName.lua"):
        load_script(BROKEN / "BadName.lua", ROOT)


# -- assembly --------------------------------------------------------------


def test_simple_script_is_returned_verbatim() -> None:
    path = ROOT / "simple-1.lua"
    script = load_script(path)
    assert script == LuaScript(
        name="simple", numkeys=1, source=path.read_text(encoding="utf-8"), path=path
    )
    assert "--- file:" not in script.source


def test_nested_includes_are_expanded_depth_first() -> None:
    source = load_script(ROOT / "nested-1.lua").source
    assert functions(source) == ["nested_c", "nested_b", "nested_a"]
    assert include_lines(source) == []
    assert "--- file:" not in source
    # the script's own code comes after everything it includes
    assert source.index("return nested_a(KEYS[1])") > source.index("local function nested_a(")
    # include text is copied exactly
    for name in ("nested_a", "nested_b", "nested_c"):
        body = (ROOT / "includes" / f"{name}.lua").read_text(encoding="utf-8")
        own = "".join(line for line in body.splitlines(keepends=True) if "@include" not in line)
        assert own.strip() in source


def test_shared_include_is_emitted_once_before_its_first_user() -> None:
    source = load_script(ROOT / "duplicate-2.lua").source
    assert source.count("local function dup_shared(") == 1
    assert functions(source) == ["dup_shared", "dup_left", "dup_right"]
    assert include_lines(source) == []


def test_each_assembly_starts_afresh() -> None:
    first = load_script(ROOT / "duplicate-2.lua").source
    assert load_script(ROOT / "duplicate-2.lua").source == first
    assert assemble(ROOT / "duplicate-2.lua", ROOT) == first


def test_include_syntax_variants(tmp_path: Path) -> None:
    (tmp_path / "includes").mkdir()
    for name in ("one", "two", "three"):
        (tmp_path / "includes" / f"{name}.lua").write_text(f"local function {name}() end\n")
    (tmp_path / "variants-0.lua").write_text(
        '--- @include "includes/one"\n'
        "  ---@include   'includes/two.lua'  \n"
        '---\t@include\t"includes/three"'  # last line, no newline
    )
    source = load_script(tmp_path / "variants-0.lua").source
    assert functions(source) == ["one", "two", "three"]
    assert include_lines(source) == []


def test_include_mentioned_mid_line_is_not_expanded(tmp_path: Path) -> None:
    (tmp_path / "prose-0.lua").write_text('-- see --- @include "includes/nope"\nreturn 1\n')
    assert load_script(tmp_path / "prose-0.lua").source.startswith("-- see --- @include")


def test_circular_include_reports_the_stack() -> None:
    with pytest.raises(ScriptLoadError) as info:
        load_script(BROKEN / "circular-0.lua", ROOT)
    message = str(info.value)
    assert "circular" in message
    assert "broken/circular-0 -> includes/cycle_a -> includes/cycle_b -> includes/cycle_a" in message


def test_self_include_is_circular(tmp_path: Path) -> None:
    (tmp_path / "loop-0.lua").write_text('--- @include "loop-0"\nreturn 1\n')
    with pytest.raises(ScriptLoadError, match="loop-0 -> loop-0"):
        load_script(tmp_path / "loop-0.lua")


def test_missing_include_names_the_file_and_the_stack() -> None:
    with pytest.raises(ScriptLoadError) as info:
        load_script(BROKEN / "missing-0.lua", ROOT)
    message = str(info.value)
    assert "includes/does_not_exist.lua" in message
    assert "broken/missing-0 -> includes/missing_parent" in message


def test_include_outside_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "scripts"
    root.mkdir()
    (tmp_path / "secret.lua").write_text("local function secret() end\n")
    (root / "escape-0.lua").write_text('--- @include "../secret"\n')
    with pytest.raises(ScriptLoadError, match="escapes"):
        load_script(root / "escape-0.lua")


# -- debug markers ---------------------------------------------------------


def test_debug_markers_show_where_each_piece_came_from() -> None:
    source = load_script(ROOT / "nested-1.lua", debug=True).source
    markers = [line for line in source.splitlines() if line.startswith("--- file: ")]
    assert markers == [
        "--- file: nested-1.lua",
        "--- file: includes/nested_a.lua",
        "--- file: includes/nested_b.lua",
        "--- file: includes/nested_c.lua",
        "--- file: includes/nested_b.lua",
        "--- file: includes/nested_a.lua",
        "--- file: nested-1.lua",
    ]
    # each function follows the marker of the file it lives in
    lines = source.splitlines()
    for name in ("nested_a", "nested_b", "nested_c"):
        at = lines.index(f"local function {name}(key)")
        last_marker = next(line for line in reversed(lines[:at]) if line.startswith("--- file: "))
        assert last_marker == f"--- file: includes/{name}.lua"
    # stripping the markers gives the plain assembly back
    plain = "".join(
        line for line in source.splitlines(keepends=True) if not line.startswith("--- file: ")
    )
    assert plain == load_script(ROOT / "nested-1.lua").source


def test_debug_marks_a_shared_include_once() -> None:
    source = load_script(ROOT / "duplicate-2.lua", debug=True).source
    assert source.count("--- file: includes/dup_shared.lua") == 1
    assert source.startswith("--- file: duplicate-2.lua\n")
    markers = [line for line in source.splitlines() if line.startswith("--- file: ")]
    assert markers == [
        "--- file: duplicate-2.lua",
        "--- file: includes/dup_left.lua",
        "--- file: includes/dup_shared.lua",
        "--- file: includes/dup_left.lua",
        "--- file: includes/dup_right.lua",  # once: its skipped include splits nothing
        "--- file: duplicate-2.lua",
    ]


# -- load_all and lua_dir --------------------------------------------------


def test_load_all_loads_top_level_scripts_only() -> None:
    scripts = load_all(ROOT)
    assert sorted(scripts) == ["duplicate", "nested", "simple"]
    assert scripts["duplicate"].numkeys == 2
    assert scripts["nested"].path == ROOT / "nested-1.lua"
    assert scripts["nested"].source == load_script(ROOT / "nested-1.lua").source
    assert "--- file:" in load_all(ROOT, debug=True)["simple"].source


def test_load_all_rejects_two_scripts_with_one_name(tmp_path: Path) -> None:
    (tmp_path / "claim-1.lua").write_text("return 1\n")
    (tmp_path / "claim-2.lua").write_text("return 2\n")
    with pytest.raises(ScriptLoadError, match="claim-1.lua and claim-2.lua"):
        load_all(tmp_path)


def test_load_all_rejects_a_bad_filename(tmp_path: Path) -> None:
    (tmp_path / "good-0.lua").write_text("return 1\n")
    (tmp_path / "Bad.lua").write_text("return 2\n")
    with pytest.raises(ScriptLoadError, match="Bad.lua"):
        load_all(tmp_path)


def test_load_all_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ScriptLoadError, match="does not exist"):
        load_all(tmp_path / "nowhere")


def test_lua_dir_prefers_the_shipped_directory(tmp_path: Path) -> None:
    package = tmp_path / "streamq"
    package.mkdir()
    assert _lua_dir_for(package) == tmp_path / "lua"  # editable install: repo's lua/
    (package / "lua").mkdir()
    assert _lua_dir_for(package) == package / "lua"  # wheel: shipped next to the code


def test_lua_dir_is_next_to_the_package() -> None:
    import streamq.storage.luaload as luaload

    package = Path(luaload.__file__).resolve().parent.parent
    assert lua_dir() in (package / "lua", package.parent / "lua")
