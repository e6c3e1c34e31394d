"""Optimizers as functional state machines on optax (the guide: docs/optimizers.md).

Every optimizer has an immutable state pytree and a step `state -> state`, run by
`run_loop` inside `jax.lax.while_loop` until a stop rule on the objective trace
fires; long runs go through the one driver (`drive`, `train`). Every loop counts
its steps up to `max_steps` and returns one `Result`. Nothing here knows a
particular model: the trainers are in `lossfns.training`. The functions
`minimize`, `finetune`, `owlqn` and `sgd_l1` share their names with their modules;
use them from this package. The loop's machinery stays in its module
(`from lossfns.optimizers.minimize import advance`).
"""

from .driver import Report, drive, train
from .elastic_net import crfsuite_elastic_net, elastic_net_training
from .finetune import finetune, train_finetune
from .minimize import (
    GradientSteps,
    LoopState,
    Result,
    Status,
    StopRule,
    epoch_step_fn,
    init_loop,
    minimize,
    minimize_stochastic,
    num_examples,
    relative_change_below,
    relative_change_over,
    relative_improvement_below,
    run_loop,
    status_name,
)
from .owlqn import elastic_net_penalty, owlqn
from .sgd_l1 import decaying_schedule, lazy_sgd_l1, sgd_l1

__all__ = [
    # optax transformations for L1 and elastic-net objectives
    "owlqn",
    "elastic_net_penalty",
    "sgd_l1",
    "lazy_sgd_l1",
    "decaying_schedule",
    "elastic_net_training",
    "crfsuite_elastic_net",
    # the loop
    "LoopState",
    "init_loop",
    "run_loop",
    "GradientSteps",
    "epoch_step_fn",
    "num_examples",
    # the driver
    "drive",
    "train",
    "Report",
    # one-call minimisation
    "minimize",
    "minimize_stochastic",
    "finetune",
    "train_finetune",
    # stop rules, status and the one result
    "StopRule",
    "relative_change_below",
    "relative_change_over",
    "relative_improvement_below",
    "Status",
    "status_name",
    "Result",
]
