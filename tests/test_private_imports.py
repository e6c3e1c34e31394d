"""Applications use the public API: no module of `experiments/` or
`benchmarks/` imports a private (`_name`) from `lossfns`, or reads one off
an imported lossfns module (`module._name`), and no lossfns subpackage
imports a private of another subpackage (modules inside one subpackage may
share privates). Static: the sources are parsed, nothing is imported."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Known exceptions, each owned by the engineer reworking that file; remove the
# entry when the file is reworked. (None at present.)
KNOWN_EXCEPTIONS: set = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


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


def _subpackage(module: str) -> str:
    """`lossfns.X` for a module inside subpackage X (or the top-level module itself)."""
    return ".".join(module.split(".")[:2])


def violations(path: Path) -> list[str]:
    """Private lossfns names that `path` reaches outside their own subpackage."""
    module = _module_of(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    found, lossfns_modules = [], set()
    application = not module.startswith("lossfns")

    def crosses(target: str) -> bool:
        return target.startswith("lossfns") and (application or _subpackage(target) != _subpackage(module))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(module, node, path.name == "__init__.py")
            for alias in node.names:
                if crosses(target) and (_private(alias.name) or any(_private(p) for p in target.split("."))):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {target} import {alias.name}")
                elif target.startswith("lossfns") and application:
                    lossfns_modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lossfns"):
                    if any(_private(p) for p in alias.name.split(".")) and crosses(alias.name):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: import {alias.name}")
                    lossfns_modules.add(alias.asname or alias.name.split(".")[0])
    if application:  # `module._name` on a name bound to something imported from lossfns
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


def test_no_private_name_crosses_a_package_boundary():
    found = [v for path in SOURCES if str(path.relative_to(ROOT)) not in KNOWN_EXCEPTIONS for v in violations(path)]
    assert not found, "private names used across packages:\n" + "\n".join(found)


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


def test_privates_shared_inside_a_subpackage_are_allowed_and_across_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "lossfns" / "losses").mkdir(parents=True)
    inside = tmp_path / "lossfns" / "losses" / "probe.py"
    inside.write_text("from ._chain_inputs import chain_inputs\nfrom .sequence import _helper\n")
    assert violations(inside) == []
    across = tmp_path / "lossfns" / "models" / "probe.py"
    across.parent.mkdir()
    across.write_text("from ..losses._chain_inputs import chain_inputs\nfrom ..lattices.forms import _time_major\n")
    assert len(violations(across)) == 2
