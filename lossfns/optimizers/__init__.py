"""Optimizers as functional state machines on optax (the guide: docs/optimizers.md).

Every optimizer has an immutable state pytree and a step `state -> state`, run by
`minimize.run_loop` inside `jax.lax.while_loop` until a stop rule on the objective
trace fires; long runs go through the one driver (`driver.drive`, `driver.train`).
Nothing here knows a particular model: the trainers are in `lossfns.training`. The
functions `minimize`, `finetune`, `owlqn` and `sgd_l1` share their names with their
modules; use them from this package. `__all__` is the public surface; the loop's
machinery stays in its module (`from lossfns.optimizers.minimize import advance`).
Names that left `__all__` or moved to `training` still read here, with a `DeprecationWarning`.
"""

from ..deprecation import moved_names
from .driver import DriveResult, Report, TrainResult, drive, train
from .elastic_net import ElasticNetTraining, crfsuite_elastic_net, elastic_net_training
from .finetune import finetune, train_finetune
from .minimize import (
    GradientSteps,
    LoopState,
    MinimizeResult,
    Status,
    StopRule,
    epoch_step_fn,
    gradient_step_fn,
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
from .sgd_l1 import decaying_schedule, lazy_sgd_l1, sgd_l1, take_rows

__all__ = [
    # the driver and the loop a run is made of
    "train",
    "TrainResult",
    "drive",
    "DriveResult",
    "Report",
    "LoopState",
    "init_loop",
    "run_loop",
    "gradient_step_fn",
    "epoch_step_fn",
    "GradientSteps",
    "num_examples",
    "StopRule",
    "relative_change_below",
    "relative_change_over",
    "relative_improvement_below",
    "Status",
    "status_name",
    "minimize",
    "minimize_stochastic",
    "MinimizeResult",
    "finetune",
    "train_finetune",
    # L1 and elastic-net training
    "owlqn",
    "elastic_net_penalty",
    "sgd_l1",
    "decaying_schedule",
    "lazy_sgd_l1",
    "take_rows",
    "elastic_net_training",
    "ElasticNetTraining",
    "crfsuite_elastic_net",
]

# Moved since 0.2 (name -> the module that holds it now, relative to this
# package: `..training` is `lossfns.training`); still found here for one release.
__getattr__ = moved_names(
    __name__,
    {
        # the trainers for particular models, now in lossfns.training
        **dict.fromkeys(
            [
                "train_linear_chain",
                "initial_chain_model",
                "lazy_epoch_step_fn",
                "max_rows_per_batch",
                "chain_batch_rows",
                "calibrate_learning_rate",
                "bcd",
                "bcd_data",
                "BcdData",
                "bcd_objective",
                "bcd_sweep_fn",
                "bcd_block_statistics",
                "perceptron",
                "SequenceData",
                "perceptron_init",
                "perceptron_epoch_fn",
                "averaged_params",
                "no_mistakes",
                "sparse_sequence_data",
                "SparseSequenceData",
                "sparse_perceptron_init",
                "sparse_perceptron_epoch",
                "sparse_averaged_params",
                "passive_aggressive",
                "pa_init",
                "pa_epoch_fn",
                "pa_params",
                "arow",
                "arow_init",
                "arow_epoch_fn",
                "arow_params",
                "MeanLossBelow",
                "reranking_data",
                "RerankingData",
                "sparse_reranking_data",
                "SparseRerankingData",
                "reranking_init",
                "boosting_with_shrinkage_step_fn",
                "fslr_step_fn",
                "blasso_step_fn",
                "run_reranker",
                "exp_loss",
                "lasso_loss",
                "sequence_boosting",
                "boost",
                "BoostingRun",
                "boosting_data",
                "BoostingData",
                "chain_boosting_data",
                "ChainBoostingData",
                "chain_boosting_model",
                "sequence_pieces",
            ],
            "..training",
        ),
        # internal since 0.2
        **dict.fromkeys(
            [
                "advance",
                "run_loop_jit",
                "optimizer_update",
                "update_and_value",
                "halt_on_failure",
                "RelativeChange",
                "RelativeImprovement",
                "CONVERGED",
                "ITERATION_LIMIT",
                "NON_FINITE_OBJECTIVE",
                "LINE_SEARCH_FAILED",
            ],
            "minimize",
        ),
        **dict.fromkeys(["describe", "fingerprint"], "driver"),
        **dict.fromkeys(
            [
                "BoostingState",
                "boosting_init",
                "boosting_converged",
                "round_bounds",
                "sequence_boosting_step_fn",
                "sequence_exp_loss",
            ],
            "..training.sequence_boosting",
        ),
        **dict.fromkeys(["OwlqnState", "pseudo_gradient"], "owlqn"),
        **dict.fromkeys(["PerceptronState", "perceptron_update"], "..training.perceptron"),
        "bcd_loss": "..training.bcd",
        "active_mask": "finetune",
        "check_elastic_net": "elastic_net",
        "RerankingState": "..training.reranking",
        "SparsePerceptronState": "..training.sparse_perceptron",
        "SgdL1State": "sgd_l1",
    },
)
