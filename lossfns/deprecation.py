"""Old spellings of the public API, kept working for one release.

When a documented argument or attribute is renamed, the old name keeps
working with a `DeprecationWarning` whose message starts with the full
`lossfns.` name of what changed, so that a caller can find it and the test
suite can turn exactly these warnings into errors (pyproject's
`filterwarnings`). Every renamed spelling goes through the two helpers here;
`REMOVED_IN` says when they go. (A public module so that every subpackage
may use it; its names are for lossfns itself, not re-exported.)
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable

REMOVED_IN = "0.3"
"""The release that removes the old spellings."""


def warn_renamed(owner: str, old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that `owner`'s `old` is now spelled `new` (`owner`: a full
    `lossfns.` name, e.g. `"lossfns.losses.hamming_loss"`)."""
    warnings.warn(
        f"{owner}: {old!r} is deprecated and will be removed in lossfns {REMOVED_IN}; use {new!r}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def renamed_arguments(**renames: str) -> Callable:
    """A decorator: the keyword arguments `old=` named in `renames` (old ->
    new) are passed on as `new=`, with a `DeprecationWarning`. Positional
    calls are unaffected (renames keep the argument's position)."""

    def decorate(function: Callable) -> Callable:
        owner = f"{function.__module__}.{function.__qualname__}"

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{owner}() got both {new!r} and its deprecated name {old!r}")
                    warn_renamed(owner, old, new)
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return wrapper

    return decorate


def moved_names(package: str, moved: dict[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` for `package` (its `__name__`): each name in
    `moved` (name -> the public module that now holds it, relative to
    `package`: `"minimize"` for `package.minimize`, or with leading dots as
    in a relative import, `"..training"` for a sibling package) is still
    found as `package.name`, with a `DeprecationWarning` saying where it
    lives now. The module is imported only when an old name is read."""

    def __getattr__(name: str):
        if name not in moved:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        target = moved[name]
        module = importlib.import_module(target if target.startswith(".") else f".{target}", package)
        warn_renamed(package, name, f"{module.__name__}.{name}")
        return getattr(module, name)

    return __getattr__
