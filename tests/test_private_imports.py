"""No underscored name crosses a module boundary: no module of `lossfns`,
`experiments/` or `benchmarks/` imports a private (`_name`, or anything from
a `_module`) of another lossfns module, or reads one off something imported
from lossfns (`module._name`). A piece two modules share is a public,
documented name of the module that owns it. Static: the sources are parsed,
nothing is imported."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Known exceptions (a file's path -> why it still reaches a private name),
# each removed when the file is reworked. (None at present.)
KNOWN_EXCEPTIONS: dict[str, str] = {}

# A named tuple's public API is spelled with one underscore.
NAMEDTUPLE_API = {"_replace", "_fields", "_asdict", "_make", "_field_defaults"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name not in NAMEDTUPLE_API


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module named by a (possibly relative) `from ... import`."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def violations(path: Path) -> list[str]:
    """Private lossfns names that `path` reaches outside the module that defines them."""
    module = _module_of(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    found, lossfns_modules = [], set()

    def crosses(target: str) -> bool:
        return target.startswith("lossfns") and target != module

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(module, node, path.name == "__init__.py")
            for alias in node.names:
                if crosses(target) and (_private(alias.name) or any(_private(p) for p in target.split("."))):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {target} import {alias.name}")
                elif target.startswith("lossfns"):
                    lossfns_modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lossfns"):
                    if any(_private(p) for p in alias.name.split(".")) and crosses(alias.name):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: import {alias.name}")
                    lossfns_modules.add(alias.asname or alias.name.split(".")[0])
    if lossfns_modules:  # `module._name` on a name bound to something imported from lossfns
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in lossfns_modules
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


SOURCES = sorted(p for folder in ("lossfns", "experiments", "benchmarks") for p in (ROOT / folder).rglob("*.py"))


def test_no_private_name_crosses_a_module_boundary():
    found = [v for path in SOURCES if str(path.relative_to(ROOT)) not in KNOWN_EXCEPTIONS for v in violations(path)]
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_the_known_exceptions_are_still_needed():
    for path, reason in KNOWN_EXCEPTIONS.items():
        assert reason and violations(ROOT / path), f"{path} no longer reaches a private name: drop its exception"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from lossfns.tagger import _weights_of\n", "from lossfns.tagger import _weights_of"),
        ("from lossfns.losses._chain_inputs import chain_inputs\n", "from lossfns.losses._chain_inputs import"),
        ("from lossfns import tagger\nx = tagger._objective()\n", "tagger._objective"),
        ("import lossfns.models.linear_chain as lc\nlc._sum_rows\n", "lc._sum_rows"),
    ],
)
def test_the_check_finds_private_imports(tmp_path, monkeypatch, source, expected):
    """The check can fail: each line above is found in an application module."""
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "probe.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert any(expected in v for v in violations(folder / "probe.py"))


def test_privates_are_refused_across_modules_inside_a_subpackage_too(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "lossfns" / "lattices").mkdir(parents=True)
    inside = tmp_path / "lossfns" / "lattices" / "probe.py"
    inside.write_text(
        "from ._forms import Form\nfrom .chain import _prepare\nfrom . import kernel\n"
        "from .kernel import Forward\nkernel._chains(1, None, 2)\nForward._make([])  # a named tuple's API\n"
    )
    assert [v.split(": ", 1)[1] for v in violations(inside)] == [
        "from lossfns.lattices._forms import Form",
        "from lossfns.lattices.chain import _prepare",
        "kernel._chains",
    ]
    across = tmp_path / "lossfns" / "models" / "probe.py"
    across.parent.mkdir()
    across.write_text("from ..losses._chain_inputs import chain_inputs\nfrom ..lattices.forms import _time_major\n")
    assert len(violations(across)) == 2
    own = tmp_path / "lossfns" / "lattices" / "__init__.py"
    own.write_text("from .chain import FactoredPotentials\n_local = 1\n")
    assert violations(own) == []
