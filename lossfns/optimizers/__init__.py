"""Optimizers as functional state machines on optax (MATH.md sections 2, 3, 5, 6).

Every optimizer has an immutable state pytree and a step `state -> state`,
run by `minimize.run_loop` inside `jax.lax.while_loop` (jit-able end to end;
a saved and reloaded state resumes bit-identically) until a stop rule on the
objective trace fires. Gradient-based ones are optax
`GradientTransformationExtraArgs`; L-BFGS itself is `optax.lbfgs`. Long
runs go through the one driver (`driver.drive`, `driver.train`: jitted
chunks of the same loop, progress, checkpoints, a device mesh).

The functions `minimize`, `bcd`, `perceptron`, `owlqn`, `sgd_l1` and
`sequence_boosting` exported here share their names with their modules;
use them from this package (`lossfns.optimizers.minimize(...)`).

`__all__` is the public surface: each optimizer's entry point, the data
and result types it takes and returns, and the pieces a custom run with the
driver needs (`init_loop`, the step functions, the stop rules). The loop's
own machinery (`advance`, `run_loop_jit`, `optimizer_update`, the status
constants behind `Status`, the optimizers' state classes, the per-round
helpers of boosting) stays in its module, for the library and its tests:
`from lossfns.optimizers.minimize import advance`. Reading one of those
from this package still works for one release, with a `DeprecationWarning`.
"""

from ..deprecation import moved_names
from .bcd import BcdData, bcd, bcd_block_statistics, bcd_data, bcd_objective, bcd_sweep_fn
from .chain_boosting import ChainBoostingData, chain_boosting_data, chain_boosting_model, sequence_pieces
from .driver import DriveResult, Report, TrainResult, drive, train
from .elastic_net import ElasticNetTraining, crfsuite_elastic_net, elastic_net_training
from .finetune import finetune, train_finetune
from .linear_chain_training import initial_chain_model, train_linear_chain
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
from .online_margin import (
    MeanLossBelow,
    arow,
    arow_epoch_fn,
    arow_init,
    arow_params,
    pa_epoch_fn,
    pa_init,
    pa_params,
    passive_aggressive,
)
from .owlqn import elastic_net_penalty, owlqn
from .perceptron import SequenceData, averaged_params, no_mistakes, perceptron, perceptron_epoch_fn, perceptron_init
from .reranking import (
    RerankingData,
    SparseRerankingData,
    blasso_step_fn,
    boosting_with_shrinkage_step_fn,
    exp_loss,
    fslr_step_fn,
    lasso_loss,
    reranking_data,
    reranking_init,
    run_reranker,
    sparse_reranking_data,
)
from .sequence_boosting import BoostingData, BoostingRun, boost, boosting_data, sequence_boosting
from .sgd_l1 import (
    calibrate_learning_rate,
    chain_batch_rows,
    decaying_schedule,
    lazy_epoch_step_fn,
    lazy_sgd_l1,
    max_rows_per_batch,
    sgd_l1,
    take_rows,
)
from .sparse_perceptron import (
    SparseSequenceData,
    sparse_averaged_params,
    sparse_perceptron_epoch,
    sparse_perceptron_init,
    sparse_sequence_data,
)

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
    "calibrate_learning_rate",
    "decaying_schedule",
    "lazy_sgd_l1",
    "lazy_epoch_step_fn",
    "max_rows_per_batch",
    "chain_batch_rows",
    "take_rows",
    "elastic_net_training",
    "ElasticNetTraining",
    "crfsuite_elastic_net",
    "train_linear_chain",
    "initial_chain_model",
    # block coordinate descent (Lavergne et al. 2010)
    "bcd",
    "bcd_data",
    "BcdData",
    "bcd_objective",
    "bcd_sweep_fn",
    "bcd_block_statistics",
    # perceptrons
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
    # CRFsuite's passive-aggressive and AROW
    "passive_aggressive",
    "pa_init",
    "pa_epoch_fn",
    "pa_params",
    "arow",
    "arow_init",
    "arow_epoch_fn",
    "arow_params",
    "MeanLossBelow",
    # reranking with L1 (Gao et al. 2006)
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
    # sequence boosting (Altun et al. 2003)
    "sequence_boosting",
    "boost",
    "BoostingRun",
    "boosting_data",
    "BoostingData",
    "chain_boosting_data",
    "ChainBoostingData",
    "chain_boosting_model",
    "sequence_pieces",
]

# Internal since 0.2 (name -> its module); still found here for one release.
__getattr__ = moved_names(
    __name__,
    {
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
            "sequence_boosting",
        ),
        **dict.fromkeys(["OwlqnState", "pseudo_gradient"], "owlqn"),
        **dict.fromkeys(["PerceptronState", "perceptron_update"], "perceptron"),
        "bcd_loss": "bcd",
        "active_mask": "finetune",
        "check_elastic_net": "elastic_net",
        "RerankingState": "reranking",
        "SparsePerceptronState": "sparse_perceptron",
        "SgdL1State": "sgd_l1",
    },
)
