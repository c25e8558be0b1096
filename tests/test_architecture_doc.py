"""docs/architecture.md's file map names every module under lavinpy/ and only modules that exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
SOURCE_SUFFIXES = (".py", ".c", ".h")
ENTRY_MAX_INDENT = 10  # entries are indented two spaces per level; continuation lines much further
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[\w.]+/?)(?:  +\S.*)?$")


def file_map() -> list[str]:
    """The map's entries as paths relative to the repository (directories end with /)."""
    text = DOC.read_text()
    section = text[text.index("## File map"):]
    block = re.search(r"^```\n(.*?)^```", section, re.M | re.S)
    assert block, "no code block under '## File map'"
    paths: list[str] = []
    parents: list[str] = []
    for number, line in enumerate(block.group(1).splitlines(), 1):
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent > ENTRY_MAX_INDENT:
            continue  # a description's continuation
        match = ENTRY.match(line)
        assert match and indent % 2 == 0, f"file map line {number} is not 'name  description': {line!r}"
        depth = indent // 2
        assert depth <= len(parents), f"file map line {number} is indented past its directory: {line!r}"
        del parents[depth:]
        path = "".join(parents) + match.group("name")
        paths.append(path)
        if path.endswith("/"):
            parents.append(match.group("name"))
    return paths


def source_modules() -> set[str]:
    root = REPO / "lavinpy"
    found = set()
    for path in root.rglob("*"):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file() or "__pycache__" in path.parts:
            continue
        relative = path.relative_to(REPO).as_posix()
        if path.name == "__init__.py":
            relative = relative.removesuffix("__init__.py")  # the directory's line stands for it
        found.add(relative)
    return found


def test_the_map_starts_at_the_package() -> None:
    assert file_map()[0] == "lavinpy/"


def test_the_map_names_only_existing_files() -> None:
    missing = [path for path in file_map() if not (REPO / path).exists()]
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_the_map_names_every_module_once() -> None:
    listed = file_map()
    repeated = sorted({path for path in listed if listed.count(path) > 1})
    assert not repeated, f"named more than once: {repeated}"
    unnamed = sorted(source_modules() - set(listed))
    assert not unnamed, f"docs/architecture.md's file map does not name: {unnamed}"
