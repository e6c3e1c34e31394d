"""The public functions of the layers agree on argument names and defaults:
a `semiring=` option defaults to `Log` (exact), an `algorithm=` option to
`"auto"` (as `chain.log_partition`), gold labels are `labels`, a
which-entries-exist argument is `mask`, and options after the arrays are
keyword-only where they are flags. Static: signatures only, nothing runs."""

import importlib
import inspect

import pytest

from lossfns import semirings

PACKAGES = [
    "lossfns.lattices.chain",
    "lossfns.lattices.dag",
    "lossfns.losses",
    "lossfns.optimizers",
    "lossfns.training",
    "lossfns.models",
    "lossfns.nn",
]
RETIRED = {"gold": "labels", "valid": "mask"}  # old names that must not come back


def _public_functions(package):
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    for name in names:
        value = getattr(module, name)
        if inspect.isfunction(value) and value.__module__.startswith("lossfns"):
            yield f"{package}.{name}", inspect.signature(value)


SIGNATURES = dict(item for package in PACKAGES for item in _public_functions(package))


def test_the_survey_covers_the_layers():
    assert len(SIGNATURES) > 80
    assert {
        "lossfns.losses.hamming_loss",
        "lossfns.training.reranking_data",
        "lossfns.lattices.dag.packed_log_partition",
    } <= set(SIGNATURES)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_argument_names_and_defaults_agree(name):
    parameters = SIGNATURES[name].parameters
    for old, new in RETIRED.items():
        assert old not in parameters, f"{name}: {old!r} is spelled {new!r} across lossfns"
    semiring = parameters.get("semiring")
    if semiring is not None and semiring.default is not inspect.Parameter.empty:
        assert semiring.default is semirings.Log, f"{name}: semiring= defaults to Log (exact)"
        assert semiring.kind is inspect.Parameter.KEYWORD_ONLY, f"{name}: semiring= is keyword-only"
    algorithm = parameters.get("algorithm")
    if algorithm is not None and name.split(".")[1] in ("lattices", "losses"):
        assert algorithm.default == "auto", f"{name}: algorithm= defaults to 'auto' as chain's functions"
        assert algorithm.kind is inspect.Parameter.KEYWORD_ONLY, f"{name}: algorithm= is keyword-only"
    if "lengths" in parameters and "labels" in parameters:
        order = list(parameters)
        assert order.index("labels") < order.index("lengths"), f"{name}: labels come before lengths"


STEP_LIMITS = ("max_iterations", "num_epochs", "num_sweeps", "max_rounds", "num_rounds")


@pytest.mark.parametrize("name", sorted(n for n in SIGNATURES if n.split(".")[1] in ("optimizers", "training")))
def test_every_loop_names_its_step_limit_max_steps(name):
    """One step limit: a loop of `optimizers` or `training` caps its steps with `max_steps`."""
    spelled = set(SIGNATURES[name].parameters) & set(STEP_LIMITS)
    assert not spelled, f"{name}: {sorted(spelled)} is spelled max_steps across optimizers and training"
