"""Data parallelism over a device mesh with JAX's own SPMD.

The training driver (`optimizers.driver.train(..., mesh=)`, and so `Tagger.fit(...,
mesh=)`) splits the data along its leading axis over the mesh's data axis and keeps
the parameters and optimizer state replicated; `sum_over_shards` sums an objective
over the shards (`jax.shard_map` and one `psum`, whose derivative is the gradient's
all-reduce). Several hosts: call `jax.distributed.initialize` on every host before
any other jax call and run the same program on the same inputs; `data_mesh()` then
spans the devices of all hosts.
Design notes: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"
"""The name of the mesh axis the data is split over."""


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:  # pyright: ignore[reportInvalidTypeForm]  # jax.Device: an alias
    """A one-axis mesh (axis `"data"`) over `devices` (default: all devices of all hosts)."""
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("devices must name at least one device")
    return Mesh(np.array(devices), (DATA_AXIS,))


def data_axis(mesh: Mesh) -> str:
    """The mesh axis that splits the data: `"data"`, or the mesh's only axis."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if DATA_AXIS in mesh.axis_names:
        return DATA_AXIS
    if len(mesh.axis_names) == 1:
        return mesh.axis_names[0]
    raise ValueError(f"mesh must have an axis named {DATA_AXIS!r} or a single axis, got axes {mesh.axis_names}")


def num_shards(mesh: Mesh) -> int:
    """How many blocks the data is split into: the size of the mesh's data axis."""
    return int(mesh.shape[data_axis(mesh)])


def _place(tree, sharding: NamedSharding):
    # Every process holds the whole value; each device takes its block
    # (one process: a plain transfer; several: only the local blocks).
    def place(leaf):
        value = np.asarray(leaf)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    return jax.tree_util.tree_map(place, tree)


def replicate(tree, mesh: Mesh):
    """A copy of every leaf of `tree` (parameters, optimizer state) on every device of `mesh`."""
    return _place(tree, NamedSharding(mesh, PartitionSpec()))


def shard_leading_axis(data, mesh: Mesh):
    """Split every leaf of `data` (`[N, ...]`, the same on every process)
    along its leading axis over the mesh's data axis; N must be divisible
    by the number of shards."""
    shards = num_shards(mesh)

    def check(path, leaf):
        shape = np.shape(leaf)
        if not shape or shape[0] % shards:
            raise ValueError(
                f"data leaf {jax.tree_util.keystr(path)} must have a leading axis divisible by the "
                f"{shards} shards of the mesh's data axis, got shape {shape}"
            )

    jax.tree_util.tree_map_with_path(check, data)
    return _place(data, NamedSharding(mesh, PartitionSpec(data_axis(mesh))))


def single_block(fn: Callable) -> Callable:
    """`fn(params, data)` as a function of a block of one stacked example
    `[1, ...]` (`features.pack_shards` gives one block per device)."""
    return lambda params, block: fn(params, jax.tree_util.tree_map(lambda x: x[0], block))


def sum_over_shards(fn: Callable, mesh: Mesh) -> Callable:
    """`(params, data) -> sum over the data's blocks of fn(params, block)`.

    fn: `(params, block) -> scalar`, a sum over the examples of its block
    (the data's leaves keep their leading axis, `[N / shards, ...]`). Each
    device evaluates its own block; the params are replicated.
    """
    axis = data_axis(mesh)

    def local(params, block):
        return jax.lax.psum(fn(params, block), axis)

    # Without replication checking: the library's custom VJPs (the sparse
    # design product, the chain kernel) return device-varying cotangents for
    # replicated weights, which the checker refuses (and, with the weights
    # cast to varying, the sparse product's gradient came out summed twice).
    # Unchecked, the gradient of the psum is the sum of the local gradients
    # (tested against one device).
    return jax.shard_map(
        local, mesh=mesh, in_specs=(PartitionSpec(), PartitionSpec(axis)), out_specs=PartitionSpec(), check_vma=False
    )
