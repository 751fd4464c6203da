"""The floors diagram of docs/architecture.md, made from the import contract.

The floors are the ``floors`` layers contract of ``[tool.importlinter]`` in
pyproject.toml, which ``make lint`` (lint-imports) holds against the code. Each
floor's comment there names its group (``# adapters: ...``); a floor without one
belongs to the group above it. ``python -m streamq.ops.floors_doc`` rewrites the
Mermaid diagram between its markers in docs/architecture.md; a test fails when
the file holds anything else there.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

__all__ = ["Floor", "diagram", "floors", "render", "update"]

ROOT = Path(__file__).resolve().parent.parent.parent
BEGIN = "<!-- generated from pyproject.toml's floors contract: python -m streamq.ops.floors_doc -->"
END = "<!-- end of the generated floors -->"

#: one floor: its group, its modules, and whether they may import each other
Floor = tuple[str, list[str], bool]


def floors(pyproject: str) -> list[Floor]:
    """The floors of the ``floors`` contract, top first, each with its group's name."""
    config = tomllib.loads(pyproject)["tool"]["importlinter"]["contracts"]
    layers = next(c for c in config if c.get("id") == "floors")["layers"]
    # the group names are the comments' first words, read from the text in order
    block = pyproject[pyproject.index('id = "floors"'):]
    block = block[block.index("layers = ["):block.index("\n]")]
    out: list[Floor] = []
    group, k = "", 0
    for line in block.splitlines()[1:]:
        line = line.strip()
        named = re.match(r"#\s*([a-z][a-z ]*):", line)
        if named:
            group = named.group(1)
        elif line.startswith('"'):
            layer = layers[k]
            k += 1
            sep = "|" if "|" in layer else ":"
            out.append((group or layer, [m.strip() for m in layer.split(sep)], sep == ":"))
    assert k == len(layers), "every floor of the contract is read"
    return out


def diagram(fl: list[Floor]) -> str:
    """A Mermaid flowchart: one box per group, its floors inside, top first; an
    arrow from each group to the one below (a module imports only its own floor and
    those below it)."""
    lines = ["```mermaid", "flowchart TB"]
    groups: list[str] = []
    for name, _, _ in fl:
        if name not in groups:
            groups.append(name)
    for g, name in enumerate(groups):
        lines.append(f'  subgraph G{g}["{name}"]')
        lines.append("    direction TB")
        rows = [(mods, shared) for n, mods, shared in fl if n == name]
        for r, (mods, shared) in enumerate(rows):
            joiner = " · " if shared else " | "
            lines.append(f'    G{g}F{r}["{joiner.join(_label(m) for m in mods)}"]')
        for r in range(len(rows) - 1):
            lines.append(f"    G{g}F{r} --> G{g}F{r + 1}")
        lines.append("  end")
    for g in range(len(groups) - 1):
        lines.append(f"  G{g} --> G{g + 1}")
    lines.append("```")
    return "\n".join(lines)


def _label(name: str, root: Path = ROOT) -> str:
    """A floor's entry: a module's name, or a folder's name and its modules."""
    folder = root / "streamq" / name
    if not (folder / "__init__.py").exists():
        return name
    mods = sorted(p.stem for p in folder.glob("*.py") if p.name != "__init__.py")
    return f"<b>{name}/</b><br/>{' · '.join(mods)}"


def render(doc: str, pyproject: str) -> str:
    """``doc`` with the diagram between the markers made again."""
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    return f"{doc[:start]}\n{diagram(floors(pyproject))}\n{doc[end:]}"


def update(root: Path = ROOT) -> bool:
    """Rewrite the diagram in docs/architecture.md; True when it changed."""
    path = root / "docs" / "architecture.md"
    old = path.read_text(encoding="utf-8")
    new = render(old, (root / "pyproject.toml").read_text(encoding="utf-8"))
    if new != old:
        path.write_text(new, encoding="utf-8")
    return new != old


if __name__ == "__main__":
    print("docs/architecture.md " + ("updated" if update() else "unchanged"))
    sys.exit(0)
