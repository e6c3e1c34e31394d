"""The layers of lossfns, in order: each module imports only from its own
layer and the layers below it (module-level and lazy imports inside
functions alike), so the folder list reads bottom-up: the algebra, the
structures, the losses, the features and models, the optimizers, the
trainers for particular models, the applications. The optimizers know no
model: they sit above the models in the table but may not import them.
Static: the sources are parsed, nothing is imported. Beside the layers:
every module docstring stays short (issue 48)."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Bottom to top. An entry is a module or a package (with all its modules);
# "lossfns" is the top-level `__init__` alone.
LAYERS = [
    (
        "utilities",
        [
            "lossfns.validation",
            "lossfns.checkpoint",
            "lossfns.compilation_cache",
            "lossfns.parallel",
            "lossfns.corpora",
            "lossfns.metrics",
        ],
    ),
    ("semirings", ["lossfns.semirings"]),
    ("lattices", ["lossfns.lattices"]),
    ("losses", ["lossfns.losses"]),
    ("checks", ["lossfns.debug", "lossfns.testing"]),  # input checks and brute-force references of the chain
    ("features", ["lossfns.features"]),
    ("models", ["lossfns.models", "lossfns.nn", "lossfns.hmm"]),
    ("optimizers", ["lossfns.optimizers"]),
    ("training", ["lossfns.training"]),
    (
        "applications",
        [
            "lossfns",
            "lossfns.model_file",
            "lossfns.crfsuite_model",
            "lossfns.tagger",
            "lossfns.crfsuite_tagger",
            "lossfns.crfsuite_training",
            "lossfns.sklearn",
            "lossfns.labelled_output",
            "lossfns.cli",
            "lossfns.__main__",
        ],
    ),
]
LAYER_NAMES = [name for name, _ in LAYERS]
# Layers below a layer that it may still not import: what trains a particular
# model lives in `training`, so the optimizers stay model-agnostic.
INDEPENDENT = {"optimizers": {"checks", "features", "models"}}


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    """The layer of a lossfns module: its longest entry in `LAYERS`."""
    best = None
    for layer, entries in LAYERS:
        for entry in entries:
            inside = module == entry or (entry != "lossfns" and module.startswith(entry + "."))
            if inside and (best is None or len(entry) > len(best[1])):
                best = (layer, entry)
    return best and best[0]


def imports(path: Path) -> list[tuple[int, str]]:
    """`(line, module)` for every lossfns (or experiments, benchmarks) module
    that `path` imports, anywhere in it; `from package import name` names the
    submodule when `name` is one."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.append((node.lineno, submodule if _is_module(submodule) else target))
    return [(line, name) for line, name in found if name.split(".")[0] in ("lossfns", "experiments", "benchmarks")]


def violations(path: Path) -> list[str]:
    """The imports of `path` that reach a higher layer, an independent one, or an application outside lossfns."""
    module = _module_of(path)
    layer = layer_of(module)
    where = f"{path.relative_to(ROOT)}"
    if layer is None:
        return [f"{where}: {module} is in no layer of tests/test_layers.py's LAYERS: put it in one"]
    found = []
    for line, target in imports(path):
        if not target.startswith("lossfns"):
            found.append(f"{where}:{line}: {module} ({layer}) imports {target}, an application outside the library")
            continue
        other = layer_of(target)
        if other is None:
            found.append(f"{where}:{line}: {module} imports {target}, which is in no layer")
        elif LAYER_NAMES.index(other) > LAYER_NAMES.index(layer):
            found.append(f"{where}:{line}: {module} ({layer}) imports {target} ({other}), a higher layer")
        elif other in INDEPENDENT.get(layer, ()):
            found.append(f"{where}:{line}: {module} ({layer}) imports {target} ({other}), which it must not know")
    return found


SOURCES = sorted((ROOT / "lossfns").rglob("*.py"))


def test_every_module_imports_only_its_layer_and_those_below():
    found = [v for path in SOURCES for v in violations(path)]
    assert not found, "imports against the layer order:\n" + "\n".join(found)


MAX_MODULE_DOCSTRING_LINES = 10


def module_docstring_lines(path: Path) -> int:
    """The lines of `path`'s module docstring, as written (0 without one)."""
    docstring = ast.get_docstring(ast.parse(path.read_text(), filename=str(path)), clean=False)
    return len(docstring.splitlines()) if docstring else 0


def test_every_module_docstring_is_at_most_10_lines():
    """A module docstring says what its module is for, in at most 10 lines: the
    design notes the code cites live in docs/internals.md (issue 48)."""
    found = [
        f"{_module_of(path)}: {lines} lines"
        for path in SOURCES
        if (lines := module_docstring_lines(path)) > MAX_MODULE_DOCSTRING_LINES
    ]
    assert not found, (
        f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines (move the detail to docs/internals.md):\n"
        + "\n".join(found)
    )


def test_every_layer_entry_exists():
    missing = [entry for _, entries in LAYERS for entry in entries if not _is_module(entry)]
    assert not missing, f"LAYERS names modules that do not exist: {missing}"


@pytest.mark.parametrize(
    "where, source, expected",
    [
        ("optimizers/probe.py", "from ..training import bcd\n", "a higher layer"),
        ("optimizers/probe.py", "from ..models.linear_chain import LinearChainModel\n", "must not know"),
        ("optimizers/probe.py", "from lossfns import features\n", "must not know"),
        ("lattices/probe.py", "def lazy():\n    from ..models import packed\n", "a higher layer"),
        ("lattices/probe.py", "import lossfns.tagger\n", "a higher layer"),
        ("losses/probe.py", "from experiments import tagging\n", "outside the library"),
        ("semirings/probe.py", "from .. import lattices\n", "a higher layer"),
        ("probe.py", "import os\n", "in no layer"),
    ],
)
def test_the_check_finds_imports_against_the_order(tmp_path, monkeypatch, where, source, expected):
    """The check can fail: each probe module imports against the order."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for package in ("lossfns", "lossfns/models", "lossfns/training", "lossfns/lattices", "lossfns/features"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "lossfns" / "tagger.py").write_text("")
    probe = tmp_path / "lossfns" / where
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text(source)
    found = violations(probe)
    assert len(found) == 1 and expected in found[0], found


def test_imports_down_and_inside_a_layer_are_allowed(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for package in ("lossfns", "lossfns/optimizers", "lossfns/models", "lossfns/training", "lossfns/losses"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "lossfns" / "validation.py").write_text("")
    probe = tmp_path / "lossfns" / "training" / "probe.py"
    probe.write_text(
        "from ..optimizers import minimize\nfrom ..models import linear_chain\nfrom . import bcd\n"
        "from .. import validation, losses\nimport jax\n"
    )
    assert violations(probe) == []
