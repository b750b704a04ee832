"""The package's floors (docs/package_map.md): a module imports only from its
own floor or the floors below it, at the top of the file or inside a function."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The map's floors, lowest first: each part of the package and its floor.
FLOORS = {
    # 0: no part of the package below them.
    "version": 0, "_checks": 0, "_tensorflow": 0, "_cpu_kernels": 0, "storage": 0, "store_clients": 0,
    "initializers": 0, "recipes": 0,
    "data": 1,
    "layers": 2,
    "models": 3,
    "training": 4, "serving": 4,
    "analysis": 5, "tuning": 5,
    "": 6,                        # the package root, keras_identity/__init__.py
    "keras_identity_cli": 7,      # the programs
}


def _part(module):
    """The part of the package a dotted module name belongs to."""
    names = module.split(".")
    if names[0] == "keras_identity_cli":
        return "keras_identity_cli"
    return names[1] if len(names) > 1 else ""


def _module(path):
    names = list(path.relative_to(ROOT).with_suffix("").parts)
    if names[-1] == "__init__":
        names.pop()
    return ".".join(names)


def _imported(tree, module, is_package):
    """Every module of this project ``tree`` imports, with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                start = ".".join(base + ([node.module] if node.module else []))
            else:
                start = node.module
            # ``from keras_identity import data``: the part is the imported name.
            names = [f"{start}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in ("keras_identity", "keras_identity_cli"):
                yield name, node.lineno


def _modules():
    files = sorted((ROOT / "keras_identity").rglob("*.py"))
    files += sorted((ROOT / "keras_identity_cli").glob("*.py"))
    return files


def test_every_part_has_a_floor():
    parts = {_part(_module(path)) for path in _modules()}
    assert parts <= set(FLOORS), f"parts without a floor: {sorted(parts - set(FLOORS))}"
    assert len(parts) > 10


def test_no_import_from_a_lower_floor_to_a_higher_one():
    upward = []
    for path in _modules():
        module = _module(path)
        floor = FLOORS[_part(module)]
        tree = ast.parse(path.read_text(), str(path))
        for name, line in _imported(tree, module, path.name == "__init__.py"):
            if name == "keras_identity" and _part(module) != "keras_identity_cli":
                upward.append(f"{path.relative_to(ROOT)}:{line} imports the package root")
                continue
            target = FLOORS.get(_part(name))
            if target is not None and target > floor:
                upward.append(f"{path.relative_to(ROOT)}:{line} ({_part(module)}, floor {floor}) "
                              f"imports {name} (floor {target})")
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("source, expected", [
    ("from keras_identity.training import schedules", "keras_identity.training.schedules"),
    ("from keras_identity import storage", "keras_identity.storage"),
    ("from .stage import unroll", "keras_identity.models.stage.unroll"),
    ("import keras_identity.models.resnet as r", "keras_identity.models.resnet"),
    ("def f():\n    from keras_identity.tuning import search\n", "keras_identity.tuning.search"),
])
def test_the_map_sees_every_form_of_import(source, expected):
    found = [name for name, _ in _imported(ast.parse(source), "keras_identity.models.x", False)]
    assert found == [expected]
