"""Optimizers as functional state machines on optax (MATH.md sections 2, 3, 5, 6).

Every optimizer has an immutable state pytree and a step `state -> state`,
run by `minimize.run_loop` inside `jax.lax.while_loop` (jit-able end to end;
a saved and reloaded state resumes bit-identically). Gradient-based ones are
optax `GradientTransformationExtraArgs`; L-BFGS itself is `optax.lbfgs`.

The functions `minimize`, `bcd`, `perceptron`, `owlqn`, `sgd_l1` and
`sequence_boosting` exported here share their names with their modules;
use them from this package (`lossfns.optimizers.minimize(...)`).
"""

from .bcd import BcdData, bcd, bcd_block_statistics, bcd_data, bcd_loss, bcd_objective, bcd_sweep_fn
from .finetune import active_mask, finetune
from .minimize import (CONVERGED, ITERATION_LIMIT, LINE_SEARCH_FAILED, NON_FINITE_OBJECTIVE, LoopState,
                       MinimizeResult, Status, drive, epoch_step_fn, gradient_step_fn, halt_on_failure, init_loop,
                       minimize, minimize_stochastic, num_examples, optimizer_update, relative_change_below,
                       run_loop, run_loop_jit, status_name, update_and_value)
from .owlqn import OwlqnState, elastic_net_penalty, owlqn, pseudo_gradient
from .perceptron import (PerceptronState, SequenceData, averaged_params, perceptron, perceptron_epoch_fn,
                         perceptron_init, perceptron_update)
from .reranking import (RerankingData, RerankingState, SparseRerankingData, blasso_step_fn,
                        boosting_with_shrinkage_step_fn, exp_loss, fslr_step_fn, lasso_loss, reranking_data,
                        reranking_init, run_reranker, sparse_reranking_data)
from .sequence_boosting import (BoostingState, boosting_statistics, sequence_boosting,
                                sequence_boosting_step_fn, sequence_exp_loss)
from .sparse_perceptron import (SparsePerceptronState, SparseSequenceData, sparse_averaged_params,
                                sparse_perceptron_epoch, sparse_perceptron_init, sparse_sequence_data)
from .sgd_l1 import SgdL1State, calibrate_learning_rate, decaying_schedule, sgd_l1

__all__ = [
    "BcdData", "bcd", "bcd_block_statistics", "bcd_data", "bcd_loss", "bcd_objective", "bcd_sweep_fn",
    "active_mask", "finetune",
    "LoopState", "MinimizeResult", "drive", "epoch_step_fn", "gradient_step_fn", "init_loop", "minimize",
    "minimize_stochastic", "num_examples", "optimizer_update", "relative_change_below", "run_loop", "run_loop_jit",
    "update_and_value", "Status", "CONVERGED", "ITERATION_LIMIT", "NON_FINITE_OBJECTIVE", "LINE_SEARCH_FAILED",
    "status_name", "halt_on_failure",
    "OwlqnState", "elastic_net_penalty", "owlqn", "pseudo_gradient",
    "PerceptronState", "SequenceData", "averaged_params", "perceptron", "perceptron_epoch_fn", "perceptron_init",
    "perceptron_update",
    "RerankingData", "RerankingState", "SparseRerankingData", "blasso_step_fn", "boosting_with_shrinkage_step_fn",
    "exp_loss", "fslr_step_fn", "lasso_loss", "reranking_data", "reranking_init", "run_reranker",
    "sparse_reranking_data",
    "BoostingState", "boosting_statistics", "sequence_boosting", "sequence_boosting_step_fn", "sequence_exp_loss",
    "SparsePerceptronState", "SparseSequenceData", "sparse_averaged_params", "sparse_perceptron_epoch",
    "sparse_perceptron_init", "sparse_sequence_data",
    "SgdL1State", "calibrate_learning_rate", "decaying_schedule", "sgd_l1",
]
