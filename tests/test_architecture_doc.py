"""docs/architecture.md's file map names every module under lavinpy/ and only modules that exist; its layer block
is pyproject.toml's layers contract, its wings block the model's (broker-layers); the README's Layout and
Development sections agree with both."""

from __future__ import annotations

import re
import tomllib
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


# --- the layer block, the modules outside the layers, and the README's account of them ---------------

README = REPO / "README.md"


def package_layers() -> list[str]:
    """pyproject.toml's layers contract of the whole package, top first, as 'lavinpy.a | lavinpy.b'."""
    with (REPO / "pyproject.toml").open("rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    [contract] = [c for c in contracts if c["id"] == "layers"]
    return [normalised(layer) for layer in contract["layers"]]


def normalised(layer: str) -> str:
    return " | ".join(name.strip() for name in layer.split("|"))


def layer_block() -> list[str]:
    """The layers of the doc's first code block: a line's first column (descriptions continue indented)."""
    text = DOC.read_text()
    block = re.search(r"^```\n(.*?)^```", text[:text.index("## File map")], re.M | re.S)
    assert block, "no layer block before '## File map'"
    return [normalised(re.split(r"\s{2,}", line)[0]) for line in block.group(1).splitlines()
            if line.strip() and not line[0].isspace()]


def test_the_layer_block_is_pyprojects_layers_contract():
    assert layer_block() == package_layers()


def test_the_modules_outside_the_layers_are_named():
    text = DOC.read_text()
    sentence = text[:text.index("sit outside the layers")]
    sentence = sentence[sentence.rindex("\n\n"):]
    named = set(re.findall(r"`([\w.]+\.py)`", sentence))
    layered = {name.strip() for layer in package_layers() for name in layer.split("|")}
    top = {path.name for path in (REPO / "lavinpy").glob("*.py")
           if path.name != "__init__.py" and f"lavinpy.{path.stem}" not in layered}
    assert named == top, f"named but missing: {sorted(named - top)}; not named: {sorted(top - named)}"


def readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_the_readme_layout_names_every_package():
    layout = readme_section("Layout")
    named = set(re.findall(r"`lavinpy/(\w+)/`", layout))
    packages = {path.name for path in (REPO / "lavinpy").iterdir() if (path / "__init__.py").is_file()}
    assert named == packages, f"named but missing: {sorted(named - packages)}; not named: {sorted(packages - named)}"


def test_the_readme_development_section_gives_pyprojects_layer_order():
    order = " > ".join(layer.replace("lavinpy.", "") for layer in package_layers())
    assert f"`{order}`" in readme_section("Development"), order


def test_the_wings_block_is_the_models_layers_contract():
    """The code block under '## The model in wings' lists pyproject.toml's broker-layers, top first."""
    with (REPO / "pyproject.toml").open("rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    [contract] = [c for c in contracts if c["id"] == "broker-layers"]
    text = DOC.read_text()
    section = text[text.index("## The model in wings"):]
    block = re.search(r"^```\n(.*?)^```", section, re.M | re.S)
    assert block, "no code block under '## The model in wings'"
    shown = [normalised(re.sub(r"(\.py|/)(?=\s*(\||$))", "", re.split(r"\s{2,}", line)[0]))
             for line in block.group(1).splitlines() if line.strip() and not line[0].isspace()]
    assert shown == [normalised(layer) for layer in contract["layers"]]
