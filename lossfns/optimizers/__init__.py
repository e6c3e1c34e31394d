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
"""

from .bcd import BcdData, bcd, bcd_block_statistics, bcd_data, bcd_loss, bcd_objective, bcd_sweep_fn
from .chain_boosting import ChainBoostingData, chain_boosting_data, chain_boosting_model, sequence_pieces
from .driver import DriveResult, Report, TrainResult, describe, drive, fingerprint, train
from .elastic_net import ElasticNetTraining, check_elastic_net, crfsuite_elastic_net, elastic_net_training
from .finetune import active_mask, finetune
from .minimize import (
                       CONVERGED,
                       ITERATION_LIMIT,
                       LINE_SEARCH_FAILED,
                       NON_FINITE_OBJECTIVE,
                       GradientSteps,
                       LoopState,
                       MinimizeResult,
                       RelativeChange,
                       RelativeImprovement,
                       Status,
                       StopRule,
                       advance,
                       epoch_step_fn,
                       gradient_step_fn,
                       halt_on_failure,
                       init_loop,
                       minimize,
                       minimize_stochastic,
                       num_examples,
                       optimizer_update,
                       relative_change_below,
                       relative_improvement_below,
                       run_loop,
                       run_loop_jit,
                       status_name,
                       update_and_value,
)
from .owlqn import OwlqnState, elastic_net_penalty, owlqn, pseudo_gradient
from .perceptron import (
                       PerceptronState,
                       SequenceData,
                       averaged_params,
                       no_mistakes,
                       perceptron,
                       perceptron_epoch_fn,
                       perceptron_init,
                       perceptron_update,
)
from .reranking import (
                       RerankingData,
                       RerankingState,
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
from .sequence_boosting import (
                       BoostingData,
                       BoostingRun,
                       BoostingState,
                       boost,
                       boosting_converged,
                       boosting_data,
                       boosting_init,
                       round_bounds,
                       sequence_boosting,
                       sequence_boosting_step_fn,
                       sequence_exp_loss,
)
from .sgd_l1 import SgdL1State, calibrate_learning_rate, decaying_schedule, sgd_l1
from .sparse_perceptron import (
                       SparsePerceptronState,
                       SparseSequenceData,
                       sparse_averaged_params,
                       sparse_perceptron_epoch,
                       sparse_perceptron_init,
                       sparse_sequence_data,
)

__all__ = [
    "BcdData", "bcd", "bcd_block_statistics", "bcd_data", "bcd_loss", "bcd_objective", "bcd_sweep_fn",
    "active_mask", "finetune",
    "ElasticNetTraining", "check_elastic_net", "crfsuite_elastic_net", "elastic_net_training",
    "DriveResult", "Report", "TrainResult", "describe", "drive", "fingerprint", "train",
    "GradientSteps", "LoopState", "MinimizeResult", "RelativeChange", "RelativeImprovement", "StopRule", "advance",
    "epoch_step_fn", "gradient_step_fn", "init_loop", "minimize", "minimize_stochastic", "num_examples",
    "optimizer_update", "relative_change_below", "relative_improvement_below", "run_loop", "run_loop_jit",
    "update_and_value", "Status", "CONVERGED", "ITERATION_LIMIT", "NON_FINITE_OBJECTIVE", "LINE_SEARCH_FAILED",
    "status_name", "halt_on_failure",
    "OwlqnState", "elastic_net_penalty", "owlqn", "pseudo_gradient",
    "PerceptronState", "SequenceData", "averaged_params", "no_mistakes", "perceptron", "perceptron_epoch_fn", "perceptron_init",
    "perceptron_update",
    "RerankingData", "RerankingState", "SparseRerankingData", "blasso_step_fn", "boosting_with_shrinkage_step_fn",
    "exp_loss", "fslr_step_fn", "lasso_loss", "reranking_data", "reranking_init", "run_reranker",
    "sparse_reranking_data",
    "BoostingData", "BoostingRun", "BoostingState", "boost", "boosting_converged", "boosting_data", "boosting_init",
    "round_bounds", "sequence_boosting", "sequence_boosting_step_fn", "sequence_exp_loss",
    "ChainBoostingData", "chain_boosting_data", "chain_boosting_model", "sequence_pieces",
    "SparsePerceptronState", "SparseSequenceData", "sparse_averaged_params", "sparse_perceptron_epoch",
    "sparse_perceptron_init", "sparse_sequence_data",
    "SgdL1State", "calibrate_learning_rate", "decaying_schedule", "sgd_l1",
]
