"""Data-parallel training on one or many devices with JAX's own SPMD.

The batch is split along its leading axis over a one-axis device mesh
(`jax.sharding.Mesh` with the axis `"batch"`); parameters and optimizer
state are replicated (`NamedSharding(mesh, PartitionSpec())`). The training
step is an ordinary `jax.jit` of `loss -> grad -> optax update` given those
shardings: XLA partitions the per-example work and inserts the all-reduce of
the gradient (the `psum` of a hand-written `shard_map`) itself. The step,
the loss function and the optimizer state are the same on 1 or N devices;
only the mesh changes, and results agree up to the order of floating-point
sums.

Single host, several devices (GPUs, or CPU devices for testing with
`XLA_FLAGS=--xla_force_host_platform_device_count=4`, which must be set
before jax initialises)::

    mesh = parallel.batch_mesh()                      # all devices
    step = parallel.make_train_step(loss_fn, optax.adam(1e-2), mesh)
    params = parallel.replicate(params, mesh)
    opt_state = parallel.replicate(optax.adam(1e-2).init(params), mesh)
    for batch in batches:                             # leading axis = examples
        params, opt_state, loss = step(params, opt_state, parallel.shard_batch(batch, mesh))

Several hosts: start the same program on every host and call, before any
other jax call,

    jax.distributed.initialize(coordinator_address="host0:1234",
                               num_processes=N, process_id=i)

(on Cloud TPU, SLURM or Open MPI the arguments are detected and may be
omitted). `batch_mesh()` then spans the devices of all hosts; every process
builds the same initial parameters (same seed), and passes *its own* block
of the global batch to `shard_batch`: the global batch is the concatenation
of the processes' blocks in process order (`jax.process_index()`), each of a
size divisible by `jax.local_device_count()`. Everything else is unchanged.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

BATCH_AXIS = "batch"


def batch_mesh(devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    """A one-axis mesh (axis `"batch"`) over `devices` (default: all devices of all hosts)."""
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("devices must name at least one device")
    return Mesh(np.array(devices), (BATCH_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    """The sharding of parameters and optimizer state: a full copy on every device."""
    return NamedSharding(mesh, PartitionSpec())


def split_over_batch(mesh: Mesh) -> NamedSharding:
    """The sharding of a batch: the leading (example) axis split over the mesh."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXIS))


def replicate(tree, mesh: Mesh):
    """A copy of every leaf of `tree` (parameters, optimizer state) on every device of `mesh`.

    Always a fresh copy (never an alias of `tree`), because the train step
    donates its parameter buffers.
    """
    return jax.device_put(tree, replicated(mesh), may_alias=False)


def shard_batch(batch, mesh: Mesh):
    """Split every leaf of `batch` (`[examples, ...]`) along its leading axis over `mesh`.

    `batch` is this process's block of the global batch (the whole batch on
    a single host); its number of examples must be divisible by the number
    of this process's devices in `mesh`.
    """
    sharding = split_over_batch(mesh)
    local_devices = sum(device.process_index == jax.process_index() for device in mesh.devices.flat)

    def place(path, leaf):
        leaf = np.asarray(leaf)
        if leaf.ndim == 0 or leaf.shape[0] % local_devices:
            raise ValueError(f"batch leaf {jax.tree_util.keystr(path)} must have a leading example axis divisible "
                             f"by the {local_devices} local devices of the mesh, got shape {leaf.shape}")
        return jax.make_array_from_process_local_data(sharding, leaf)

    return jax.tree_util.tree_map_with_path(place, batch)


def make_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, mesh: Mesh):
    """One data-parallel optimisation step, compiled for `mesh`.

    Args:
      loss_fn: `loss_fn(params, batch) -> scalar`, the mean (or sum) over the
        examples of `batch`; written for the whole batch, as on one device.
      optimizer: an optax transformation (its state comes from
        `optimizer.init(params)`, placed with `replicate`).
      mesh: from `batch_mesh`.
    Returns:
      `step(params, opt_state, batch) -> (params, opt_state, loss)`; `batch`
      from `shard_batch`. The parameter and state buffers are donated
      (updated in place): do not reuse the arguments after the call.
    """
    copy, split = replicated(mesh), split_over_batch(mesh)

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, in_shardings=(copy, copy, split), out_shardings=(copy, copy, copy), donate_argnums=(0, 1))
