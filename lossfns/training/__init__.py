"""Trainers for particular models, above `models` and `optimizers`.

Each trainer is a step factory and the data layout it reads, run by the optimizers'
loop (`optimizers.run_loop`) or driver (`optimizers.drive`), its step limit
`max_steps`, its result an `optimizers.Result`: the linear-chain CRF end to end
(`train_linear_chain`), lazy SGD-L1 on its rows (`lazy_epoch_step_fn`), block
coordinate descent (`bcd`), the perceptrons, CRFsuite's passive-aggressive and
AROW, sequence boosting and Gao et al.'s rerankers. `optimizers` imports nothing
from here. `bcd`, `perceptron` and `sequence_boosting` share their names with
their modules; use them from this package (`lossfns.training.bcd(...)`)."""

from .bcd import BcdData, bcd, bcd_block_statistics, bcd_data, bcd_objective, bcd_sweep_fn
from .chain_boosting import ChainBoostingData, chain_boosting_data, chain_boosting_model, sequence_pieces
from .linear_chain import initial_chain_model, train_linear_chain
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
from .perceptron import SequenceData, averaged_params, no_mistakes, perceptron, perceptron_epoch_fn, perceptron_init
from .reranking import (
    RerankingData,
    SparseRerankingData,
    blasso_step_fn,
    boosting_with_shrinkage_step_fn,
    exp_loss,
    fslr_step_fn,
    reranking_data,
    reranking_init,
    sparse_reranking_data,
)
from .sequence_boosting import boost, boosting_stopped_by, sequence_boosting
from .sgd_l1 import calibrate_learning_rate, lazy_epoch_step_fn, max_rows_per_batch
from .sparse_online_margin import TokenStack, sparse_arow_epoch_fn, sparse_pa_epoch_fn, token_stack
from .sparse_perceptron import (
    SparseSequenceData,
    sparse_averaged_params,
    sparse_perceptron_epoch,
    sparse_perceptron_init,
    sparse_sequence_data,
)

__all__ = [
    # the linear-chain CRF: elastic-net training through the driver, lazy SGD-L1
    "train_linear_chain",
    "initial_chain_model",
    "lazy_epoch_step_fn",
    "max_rows_per_batch",
    "calibrate_learning_rate",
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
    "token_stack",
    "TokenStack",
    "sparse_pa_epoch_fn",
    "sparse_arow_epoch_fn",
    # reranking with L1 (Gao et al. 2006)
    "reranking_data",
    "RerankingData",
    "sparse_reranking_data",
    "SparseRerankingData",
    "reranking_init",
    "boosting_with_shrinkage_step_fn",
    "fslr_step_fn",
    "blasso_step_fn",
    "exp_loss",
    # sequence boosting (Altun et al. 2003)
    "sequence_boosting",
    "boost",
    "boosting_stopped_by",
    "chain_boosting_data",
    "ChainBoostingData",
    "chain_boosting_model",
    "sequence_pieces",
]
