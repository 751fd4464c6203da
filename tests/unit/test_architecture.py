"""The floors of the code as docs/architecture.md draws them (no server)."""

from __future__ import annotations

import re
from pathlib import Path

from streamq.ops import floors_doc

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_the_architecture_docs_diagram_is_made_from_the_floors_contract() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert floors_doc.render(text, PYPROJECT) == text, "run: python -m streamq.ops.floors_doc"


def test_every_floor_is_read_with_its_group_top_first() -> None:
    floors = floors_doc.floors(PYPROJECT)
    groups = list(dict.fromkeys(name for name, _, _ in floors))
    assert groups[:3] == ["entry", "adapters", "programs"] and groups[-2:] == ["storage", "base"]
    modules = [m for _, mods, _ in floors for m in mods]
    assert len(modules) == len(set(modules))
    # every module of the package stands on one floor (the contract is exhaustive)
    package = {p.stem for p in (ROOT / "streamq").glob("*.py") if p.name != "__init__.py"}
    package |= {p.name for p in (ROOT / "streamq").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    assert package == set(modules)


def test_every_module_is_named_in_the_design_references_module_table() -> None:
    """docs/design/modules.md says what each module does: a module added or renamed
    without a row there fails this."""
    root = Path(__file__).resolve().parents[2]
    table = (root / "docs" / "design" / "modules.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w/]+\.py)`", table))
    packages = {m.group(1) for m in re.finditer(r"^\| `(\w+)/` \|", table, re.M)}
    missing = []
    for path in sorted((root / "streamq").rglob("*.py")):
        rel = path.relative_to(root / "streamq").as_posix()
        if path.name == "__init__.py" and rel != "__init__.py":
            continue
        if rel.split("/")[0] in packages or rel in named or path.name in named:
            continue
        missing.append(rel)
    assert missing == []
