"""Every public name is documented and rendered on an API page.

The API pages (docs/api/*.md) render modules with mkdocstrings (`::: module`
directives, `filters: public`): a package shows the names in its `__all__`,
a module without `__all__` its non-underscore names defined there. This test
reads the code as mkdocstrings does (griffe, static analysis) and fails when
a public name has no docstring, when a name in `__all__` is one griffe cannot
see or takes for something else (a constant set by tuple unpacking, a
function that shares its name with a submodule: mkdocstrings would leave
those out), or when a module is on no API page and its public names are not
re-exported by a package that is.
"""

import functools
import importlib
import inspect
import pathlib
import pkgutil
import re

import griffe
import pytest

import lossfns

ROOT = pathlib.Path(__file__).resolve().parents[1]
API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))
# `::: module` directives, with the `members: [...]` option where a page narrows one.
DIRECTIVES = {
    name: members and [member.strip() for member in members.split(",")]
    for page in API_PAGES
    for name, members in re.findall(
        r"^::: ([\w.]+)(?:\n +options:\n +members: \[([^\]]*)\])?", page.read_text(), flags=re.M
    )
}
RENDERED = list(DIRECTIVES)
# Run as programs, not imported by users: the command line is documented on its own page.
NOT_A_LIBRARY = {"lossfns.__main__"}
# Modules whose public functions document their arguments and results in `Args:` and
# `Returns:` sections, with shapes (issue 48); for lossfns.nn its classes' methods too.
ARGS_AND_RETURNS = (
    "lossfns.losses",
    "lossfns.lattices.chain",
    "lossfns.lattices.sparse_chain",
    "lossfns.lattices.decode",
    "lossfns.lattices.dag",
    "lossfns.models.packed",
    "lossfns.nn",
    "lossfns.semirings",
)
WITH_METHODS = {"lossfns.nn"}


def _modules():
    names = ["lossfns"] + [info.name for info in pkgutil.walk_packages(lossfns.__path__, "lossfns.")]
    return [
        name
        for name in names
        if not any(part.startswith("_") for part in name.split(".")) and name not in NOT_A_LIBRARY
    ]


@functools.cache
def _package():
    return griffe.load("lossfns", search_paths=[str(ROOT)], docstring_parser="google")


def _griffe_module(module_name):
    return _package()[module_name.removeprefix("lossfns.")] if module_name != "lossfns" else _package()


def _public_names(module_name):
    """What the API page shows for a module: `__all__` (read at run time, so
    names griffe misses are caught), or else what griffe calls public: the
    non-underscore names defined in the module itself, not imported."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, member in _griffe_module(module_name).members.items()
        if not member.is_alias and not member.is_module and member.is_public
    ]


def _resolved(member):
    return member.final_target if member.is_alias else member


def test_every_api_directive_names_a_module():
    assert RENDERED, "no ::: directives on the API pages"
    for name in RENDERED:
        importlib.import_module(name)


@pytest.mark.parametrize("module_name", sorted(set(RENDERED)))
def test_public_names_are_rendered_with_a_docstring(module_name):
    module = _griffe_module(module_name)
    runtime = importlib.import_module(module_name)
    problems = []
    for name in DIRECTIVES[module_name] or _public_names(module_name):
        value = getattr(runtime, name)
        member = module.members.get(name)
        if member is None:
            problems.append(f"{name}: not seen by griffe (set by tuple unpacking or dynamically?)")
            continue
        try:
            target = _resolved(member)
        except griffe.AliasResolutionError:
            problems.append(f"{name}: griffe cannot resolve {member.target_path}")
            continue
        if target.is_module and not inspect.ismodule(value):
            # A function named like its own submodule: griffe sees the
            # submodule, so the page must render that module to show it.
            if target.path not in RENDERED:
                problems.append(f"{name}: shadowed by submodule {target.path}, which no API page renders")
            continue
        if inspect.ismodule(value):
            if value.__name__ not in RENDERED:
                problems.append(f"{name}: submodule {value.__name__} is on no API page")
            continue
        if not target.docstring or not target.docstring.value.strip():
            problems.append(f"{name}: no docstring")
    assert not problems, f"{module_name}:\n  " + "\n  ".join(problems)


def _implementation(module_name):
    """A submodule of a package whose `__all__` leaves it out: that package's
    `__all__` is its public surface (rendered on the package's page)."""
    parent_name, _, name = module_name.rpartition(".")
    parent = importlib.import_module(parent_name) if parent_name else None
    return hasattr(parent, "__all__") and name not in parent.__all__


@pytest.mark.parametrize("module_name", _modules())
def test_every_module_is_documented(module_name):
    module = importlib.import_module(module_name)
    assert inspect.getdoc(module), f"{module_name} has no module docstring"
    assert module_name in RENDERED or _implementation(module_name), (
        f"{module_name} is on no API page (docs/api/*.md): add `::: {module_name}` to a page, or leave it out of "
        f"its package's __all__ if it is an implementation module"
    )


def _documented_functions(module_name):
    """`(name, griffe function)` for the public functions of `module_name`
    (its `__all__`, or else its own public names), and with `WITH_METHODS`
    the public methods of its public classes."""
    module = _griffe_module(module_name)
    for name in _public_names(module_name):
        target = _resolved(module.members[name])
        if target.is_function:
            yield name, target
        elif target.is_class and module_name in WITH_METHODS:
            for method_name, method in target.members.items():
                if method.is_function and not method_name.startswith("_"):
                    yield f"{name}.{method_name}", method


def _section_kinds(function):
    """The kinds of the sections griffe parses from a docstring (google style)."""
    if not function.docstring:
        return set()
    sections = griffe.parse_google(function.docstring, warn_unknown_params=False, warn_missing_types=False)
    return {section.kind for section in sections}


@pytest.mark.parametrize("module_name", ARGS_AND_RETURNS)
def test_public_functions_document_args_and_returns(module_name):
    """Each public function says what it takes and what it returns, in
    sections griffe parses (a section title needs a blank line above it)."""
    functions = list(_documented_functions(module_name))
    assert functions, f"{module_name}: no public functions found"
    problems = []
    for name, function in functions:
        kinds = _section_kinds(function)
        takes_arguments = any(parameter.name not in ("self", "cls") for parameter in function.parameters)
        if takes_arguments and griffe.DocstringSectionKind.parameters not in kinds:
            problems.append(f"{name}: no Args: section")
        if griffe.DocstringSectionKind.returns not in kinds:
            problems.append(f"{name}: no Returns: section")
    assert not problems, f"{module_name}:\n  " + "\n  ".join(problems)
