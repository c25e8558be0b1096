"""The project's rules that no tool checks by itself: every module of a package is in its layers contract,
no source file passes 600 lines, the faces keep no books (counters belong to the model), the model
raises its own errors, not a protocol's, and methods that carry a name are built without pamqp's check."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "lavinpy"
MAX_LINES = 600
SOURCE_DIRS = ("lavinpy", "tests", "bench", "examples")
SOURCE_SUFFIXES = (".py", ".c", ".h")
FACES = ("amqp", "mqtt", "http")


def contracts() -> list[dict]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]["contracts"]


def layer_names(contract: dict) -> set[str]:
    return {name.strip() for layer in contract["layers"] for name in layer.split("|")}


def modules_of(package: Path) -> set[str]:
    """The direct modules and sub-packages of a package directory, by name."""
    found = {path.stem for path in package.glob("*.py") if path.name != "__init__.py"}
    found |= {path.name for path in package.iterdir() if (path / "__init__.py").is_file()}
    return found


def test_every_container_contract_names_every_module_of_its_package():
    checked = 0
    missing: dict[str, list[str]] = {}
    for contract in contracts():
        if contract["type"] != "layers" or "containers" not in contract:
            continue
        for container in contract["containers"]:
            checked += 1
            package = REPO.joinpath(*container.split("."))
            unnamed = sorted(modules_of(package) - layer_names(contract))
            if unnamed:
                missing[f"{contract['id']} ({container})"] = unnamed
    assert checked >= 7, "the layers contracts with containers were not found in pyproject.toml"
    assert not missing, f"modules left out of their package's layers contract in pyproject.toml: {missing}"


def test_every_container_contract_names_only_existing_modules():
    ghosts = {}
    for contract in contracts():
        if contract["type"] == "layers" and "containers" in contract:
            [container] = contract["containers"]
            package = REPO.joinpath(*container.split("."))
            if extra := sorted(layer_names(contract) - modules_of(package)):
                ghosts[contract["id"]] = extra
    assert not ghosts, f"layers contracts name modules that do not exist: {ghosts}"


def test_every_subpackage_is_in_the_package_layers_or_a_client():
    """A new sub-package of lavinpy is either a layer of the whole package or one of the network clients
    that may use lavinpy.wire only."""
    by_id = {contract["id"]: contract for contract in contracts()}
    placed = {name.removeprefix("lavinpy.") for name in layer_names(by_id["layers"])}
    placed |= {name.removeprefix("lavinpy.") for name in by_id["clients-on-wire"]["source_modules"]}
    subpackages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    assert subpackages - placed == set(), "sub-packages in no contract of pyproject.toml"


def test_no_source_file_passes_the_line_limit():
    long = {}
    for top in SOURCE_DIRS:
        for path in (REPO / top).rglob("*"):
            if path.suffix in SOURCE_SUFFIXES and path.is_file() and "__pycache__" not in path.parts:
                lines = len(path.read_bytes().splitlines())
                if lines > MAX_LINES:
                    long[path.relative_to(REPO).as_posix()] = lines
    assert not long, f"files over {MAX_LINES} lines (split them by what they do): {long}"


def counter_writes(source: str) -> list[int]:
    """Lines that write into a counts table: `<...>counts[key] += n` (or -=), or `<obj>.counts[key] = v`.
    A face hands what happened to the model's operations; the model counts."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AugAssign):
            targets = [node.target]
        elif isinstance(node, ast.Assign):
            targets = [t for t in node.targets if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute)]
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Subscript):
                table = target.value
                name = table.attr if isinstance(table, ast.Attribute) else getattr(table, "id", "")
                if name.endswith("counts"):
                    lines.append(node.lineno)
    return lines


def face_counter_writes() -> dict[str, list[int]]:
    found = {}
    for face in FACES:
        for path in sorted((PACKAGE / face).rglob("*.py")):
            if lines := counter_writes(path.read_text()):
                found[path.relative_to(REPO).as_posix()] = lines
    return found


def test_faces_write_into_no_counter():
    writes = face_counter_writes()
    assert not writes, f"a face writes into a counter (count in the model's operations instead): {writes}"


def test_the_model_raises_no_protocol_error():
    """broker.errors is the model's; each face maps its kinds to its own codes (amqp/refusals.py,
    http/errors.py, the MQTT CONNACK table)."""
    found = {}
    for path in sorted((PACKAGE / "broker").rglob("*.py")):
        lines = [i for i, line in enumerate(path.read_text().splitlines(), 1)
                 if "wire.errors" in line or "AMQPChannelError" in line or "AMQPConnectionError" in line]
        if lines:
            found[path.relative_to(REPO).as_posix()] = lines
    assert not found, f"the model names AMQP's error classes: {found}"


def test_the_front_door_contract_closes_every_other_module_of_the_model():
    """A module added to lavinpy.broker is closed to the faces unless it is the front door (ops) or the
    model's errors: the faces-through-the-front-door contract must name it (or its wing)."""
    by_id = {contract["id"]: contract for contract in contracts()}
    contract = by_id["faces-through-the-front-door"]
    closed = {name.removeprefix("lavinpy.broker.") for name in contract["forbidden_modules"]}
    open_to_faces = {"ops", "errors"}
    model = modules_of(PACKAGE / "broker")
    assert model - open_to_faces == closed, (
        f"not closed to the faces: {sorted(model - open_to_faces - closed)}; "
        f"named but not a module of lavinpy.broker: {sorted(closed - model)}")
    faces = {name.removeprefix("lavinpy.") for name in contract["source_modules"]}
    assert {"amqp", "mqtt", "http"} <= faces


# pamqp's constructors check names against a narrower pattern than RabbitMQ's (ASCII only, exchanges up
# to 127 characters) and refuse, say, a shovel's source queue named in Cyrillic.
_NAMED_METHOD = re.compile(r"\b(?:spec|commands)\.(?:Queue\.(?:Declare|Delete|Bind|Unbind|Purge|DeclareOk)"
                           r"|Exchange\.(?:Declare|Delete|Bind|Unbind)|Basic\.(?:Consume|Get|GetOk|Publish|Deliver"
                           r"|Return)|Connection\.Open)\(")


def test_methods_that_carry_a_name_are_built_without_pamqps_name_check():
    """Every method holding an exchange, queue or vhost name is made by lavinpy.wire.frames.build_method
    (or encoded by hand), whichever client or face sends it."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = [i for i, line in enumerate(path.read_text().splitlines(), 1) if _NAMED_METHOD.search(line)]
        if lines:
            found[path.relative_to(REPO).as_posix()] = lines
    assert not found, f"a pamqp constructor refuses names RabbitMQ takes; use build_method: {found}"
