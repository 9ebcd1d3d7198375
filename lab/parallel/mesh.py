"""Device meshes over ``("data", "model")`` and multi-host start-up.

One mesh shape serves every Lab job: ``data`` splits the batch, ``model``
splits attention heads, the FFN hidden width and the vocabulary (Megatron-style
tensor parallelism, the layout of maxtext's ``data``/``tensor`` axes). A single
host with 8 devices runs ``make_mesh(data=2, model=4)``; on many hosts call
:func:`initialize` first, before any other JAX call, then build the mesh over
``jax.devices()`` (all hosts' devices).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

AXES = ("data", "model")


def make_mesh(data: int | None = None, model: int = 1, *,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Returns a ``Mesh`` of shape ``(data, model)`` with axes ``("data", "model")``.

    Args:
      data: size of the batch axis; ``None`` takes every device not used by ``model``.
      model: size of the tensor-parallel axis.
      devices: the devices to use (default ``jax.devices()``).

    Axes are ``AxisType.Auto``: the compiler (GSPMD) propagates shardings from
    the inputs, so model code needs no sharding annotations.

    Raises ValueError when ``data * model`` differs from the number of devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if not isinstance(model, int) or model < 1 or n % model:
        raise ValueError(f"make_mesh(model={model!r}); expected a positive divisor of the "
                         f"{n} devices")
    if data is None:
        data = n // model
    if not isinstance(data, int) or data < 1 or data * model != n:
        raise ValueError(f"make_mesh(data={data!r}, model={model}) needs data * model == {n} "
                         f"devices")
    grid = np.asarray(devices, dtype=object).reshape(data, model)
    return Mesh(grid, AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def _positive_int(env: Mapping[str, str], name: str, minimum: int) -> int:
    value = env.get(name)
    try:
        out = int(value)
    except (TypeError, ValueError):
        out = None
    if out is None or out < minimum:
        raise ValueError(f"environment variable {name}={value!r}; expected an int >= {minimum} "
                         "(set with JAX_COORDINATOR_ADDRESS for multi-host start-up)")
    return out


def initialize(env: Mapping[str, str] | None = None) -> bool:
    """Starts multi-host JAX (``jax.distributed.initialize``) when the environment asks for it.

    Returns True when it initialised, False when the environment describes a
    single process (then nothing is called). Two ways to ask:

    * explicit: ``JAX_COORDINATOR_ADDRESS=host:port``, ``JAX_NUM_PROCESSES=N``,
      ``JAX_PROCESS_ID=i`` (``0 <= i < N``) on every host, the same address on all;
    * auto-detected: ``LAB_DISTRIBUTED=1`` lets JAX read a cluster it knows
      (Slurm, Open MPI, Cloud TPU pods, Kubernetes jobs).

    Call it once per process before any other JAX call; a second call is a
    no-op that returns True. Raises ValueError for a malformed variable.
    """
    env = os.environ if env is None else env
    address = env.get("JAX_COORDINATOR_ADDRESS")
    auto = env.get("LAB_DISTRIBUTED", "0") not in ("", "0", "false", "False")
    if not address and not auto:
        return False
    if jax.distributed.is_initialized():
        return True
    if not address:
        jax.distributed.initialize()
        return True
    if ":" not in address:
        raise ValueError(f"environment variable JAX_COORDINATOR_ADDRESS={address!r}; expected "
                         "'host:port'")
    n = _positive_int(env, "JAX_NUM_PROCESSES", 1)
    pid = _positive_int(env, "JAX_PROCESS_ID", 0)
    if pid >= n:
        raise ValueError(f"environment variable JAX_PROCESS_ID={pid} is not below "
                         f"JAX_NUM_PROCESSES={n}")
    jax.distributed.initialize(coordinator_address=address, num_processes=n, process_id=pid)
    return True
