"""Sharding Lab models over a ``("data", "model")`` device mesh, and multi-host start-up.

    mesh = lab.parallel.make_mesh(data=2, model=4)
    lab.parallel.shard_model(model, mesh)          # weights by lab.parallel.RULES
    logits = lab.parallel.forward(model, tokens, mesh)
    gen = lab.infer.generate(model, prompts, max_new_tokens=32)  # runs on the sharded weights

Training on a mesh: ``lab.train.Trainer(..., mesh=mesh)`` (see docs/scale.md).
On many hosts call :func:`initialize` first (see its docstring for the
environment variables).
"""

from lab.parallel.mesh import AXES, initialize, make_mesh
from lab.parallel.sharding import (
    RULES,
    batch_specs,
    forward,
    mesh_of,
    named,
    partition_specs,
    path_str,
    place,
    shard_batch,
    shard_model,
    spec_for,
    tree_specs,
)

__all__ = ["AXES", "RULES", "batch_specs", "forward", "initialize", "make_mesh", "mesh_of",
           "named", "partition_specs", "path_str", "place", "shard_batch", "shard_model",
           "spec_for", "tree_specs"]
