"""The jitted train step: a pure function of (params, other model state, optimizer state, batch).

Follows flax's performance guide (``guides/performance.md``): the model is split
once into a graph definition and states, the step is jitted over the states and
merges the model inside the trace. The optimizer is rebuilt inside the trace
from the (hashable) :class:`TrainConfig`, so trainers of the same model
structure, loss and config share one compiled step (methods that train many
tiny models compile once).

Gradient accumulation splits the batch's leading axis into ``grad_accum``
micro-batches and runs them in a ``lax.scan``. Micro-batch gradients and metrics
are averaged with weights ``metrics["loss_weight"]`` if the loss reports it,
else ``metrics["tokens"]``, else 1, so that for a loss that is a mean over
tokens (``sft_loss``) the accumulated gradient equals the full-batch gradient.

On a device mesh (:class:`StepLayout`, built by :class:`lab.train.Trainer` from
:mod:`lab.parallel`'s rules) the same step is jitted with explicit input and
output shardings: parameters and optimizer state keep their layout across
steps (so donation reuses their buffers), the batch is split over ``"data"``,
the gradients are constrained to the parameters' layout (under FSDP GSPMD then
reduce-scatters them instead of all-reducing) and each accumulated micro-batch
is split over ``"data"`` too. GSPMD inserts the collectives; the numbers equal
the unsharded step's up to float reassociation of the reductions.

Mixed precision (``TrainConfig.precision="bfloat16"``): the parameters and the
optimizer state stay float32 (the master weights); inside the trace the step
merges them into the model and makes that copy's ``nnx.Linear`` layers multiply
through :class:`MixedMatmul` (:func:`use_mixed_matmul`): both operands rounded to
bfloat16, products accumulated in float32, the result returned in the layer's own
dtype; its backward computes the input and weight gradients the same way and
hands them back in float32. Everything else (embeddings, norms, attention,
softmax, the loss, the optimizer) runs as the model defines it, float32 for a
float32 model. This is the split of Micikevicius et al. (2018, "Mixed Precision
Training") and of ``torch.autocast`` (matmuls in low precision, float32 master
weights), with the products' outputs left in float32 instead of rounded to
bfloat16 (no loss scaling is needed: bfloat16 has float32's exponent range).

Every product the matmul issues has the operand layouts XLA's CPU backend hands
to its YNNPACK library in bfloat16 (``x [M, K] @ w [K, N]``, both row-major, float32
result): the backward materialises ``x.T`` and ``w.T`` row-major
(:func:`_row_major_transpose`). XLA upcasts a bfloat16 dot with any other operand
layout to float32 (its ``operand_upcaster`` pass), which would lose the speed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from lab.nn import Fused
from lab.train.config import TrainConfig, make_optimizer, make_schedule

COUNT_KEYS = ("tokens", "loss_weight")  # summed over micro-batches, not averaged


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul(x: jax.Array, w: jax.Array, compute: str) -> jax.Array:
    """``x [M, K] @ w [K, N]`` with operands in ``compute``, accumulated in float32."""
    return jax.lax.dot(x.astype(compute), w.astype(compute), preferred_element_type=jnp.float32)


def _matmul_fwd(x, w, compute):
    xc, wc = x.astype(compute), w.astype(compute)
    # Zero-size arrays carry the input dtypes to the backward (residuals must be arrays).
    marks = (jnp.zeros((0,), x.dtype), jnp.zeros((0,), w.dtype))
    return jax.lax.dot(xc, wc, preferred_element_type=jnp.float32), (xc, wc, marks)


def _row_major_transpose(a: jax.Array) -> jax.Array:
    """``a.T`` materialised row-major. A plain ``a.T`` lowers to a column-major layout that
    XLA folds into the dot (or keeps as the operand's layout), which its CPU backend then
    runs in float32; the flattened copy behind an optimization barrier cannot be folded."""
    flat = jax.lax.optimization_barrier(a.T.reshape(-1))
    return flat.reshape(a.shape[1], a.shape[0])


def _matmul_bwd(compute, res, g):
    xc, wc, (x_mark, w_mark) = res
    gc = g.astype(compute)
    dx = jax.lax.dot(gc, _row_major_transpose(wc), preferred_element_type=jnp.float32)  # [M, K]
    dw = jax.lax.dot(_row_major_transpose(xc), gc, preferred_element_type=jnp.float32)  # [K, N]
    return dx.astype(x_mark.dtype), dw.astype(w_mark.dtype)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


@dataclasses.dataclass(frozen=True)
class MixedMatmul:
    """A ``dot_general`` for ``nnx.Linear`` that multiplies in ``compute`` (e.g. bfloat16).

    A Linear's contraction (``x [..., K]`` with ``w [K, N]``, no batch dimensions) runs
    as one 2-D product through :func:`_matmul` (operands in ``compute``, float32
    accumulation, the gradients likewise); any other contraction runs as
    ``lax.dot_general`` on ``compute`` operands with float32 accumulation (and jax's
    own gradient). The result has the dtype ``lax.dot_general`` would have given
    (``preferred_element_type`` if set, else the operands' promoted dtype). Frozen,
    so that it hashes by value inside a graph definition.
    """

    compute: str = "bfloat16"

    def __call__(self, lhs, rhs, dimension_numbers, precision=None,
                 preferred_element_type=None, out_sharding=None):
        (lc, rc), (lb, rb) = dimension_numbers
        out_dtype = preferred_element_type or jnp.result_type(lhs, rhs)
        if (not lb and not rb and rhs.ndim == 2 and lhs.ndim >= 2 and out_sharding is None
                and tuple(lc) == (lhs.ndim - 1,) and tuple(rc) == (0,)):
            out = _matmul(lhs.reshape(-1, lhs.shape[-1]), rhs, self.compute)
            out = out.reshape(*lhs.shape[:-1], rhs.shape[1])
        else:
            out = jax.lax.dot_general(lhs.astype(self.compute), rhs.astype(self.compute),
                                      dimension_numbers, precision,
                                      preferred_element_type=jnp.float32,
                                      out_sharding=out_sharding)
        return out.astype(out_dtype)


def use_mixed_matmul(model: nnx.Module, compute: str = "bfloat16") -> nnx.Module:
    """Makes every ``nnx.Linear`` and :class:`lab.nn.Fused` projection of ``model``
    multiply through :class:`MixedMatmul` (``compute``), in place; returns ``model``.
    The parameters are not touched.

    Raises ValueError if a Linear already has a custom ``dot_general``.
    """
    for path, module in nnx.iter_modules(model):
        if isinstance(module, (nnx.Linear, Fused)):
            if isinstance(module.dot_general, MixedMatmul):
                module.dot_general = MixedMatmul(compute)
            elif module.dot_general is not jax.lax.dot_general:
                where = "/".join(map(str, path)) or "<root>"
                raise ValueError(f"TrainConfig.precision={compute!r}: the nnx.Linear at {where} "
                                 f"has its own dot_general {module.dot_general!r}; expected "
                                 "jax.lax.dot_general")
            else:
                module.dot_general = MixedMatmul(compute)
    return model


def _micro_weight(metrics: dict) -> jax.Array:
    for key in ("loss_weight", "tokens"):
        if key in metrics:
            return jnp.asarray(metrics[key], jnp.float32)
    return jnp.float32(1.0)


def _loss_and_state(graphdef, loss_fn, pass_rng, precision: str = "float32"):
    """Returns ``f(params, rest, batch, key) -> (loss, (metrics, new_rest))``."""

    def f(params, rest, batch, key):
        # Fresh Variable objects at this trace level: NNX refuses to mutate (e.g. an RNG
        # stream's count) a Variable created in an outer trace.
        rest = jax.tree.map(lambda x: x, rest)
        model = nnx.merge(graphdef, params, rest)
        if precision != "float32":
            use_mixed_matmul(model, precision)  # this traced copy only
        out = loss_fn(model, batch, rng=key) if pass_rng else loss_fn(model, batch)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            raise ValueError("loss_fn(model, batch) must return (loss, metrics_dict); got "
                             f"{type(out).__name__}")
        loss, metrics = out
        if jnp.shape(loss) != ():
            raise ValueError(f"loss_fn must return a scalar loss; got shape {jnp.shape(loss)}")
        metrics = {k: jnp.asarray(v, jnp.float32) for k, v in {"loss": loss, **metrics}.items()}
        _, _, new_rest = nnx.split(model, nnx.Param, ...)
        return loss, (metrics, new_rest)

    return f


def _accumulate(grad_fn, params, rest, batch, key, n: int, micro_sharding=None):
    """Runs ``n`` micro-batches in a scan; returns weighted-mean grads and metrics.

    ``micro_sharding(x)`` (on a mesh) gives the sharding of a ``[n, size // n, ...]``
    stack of micro-batches: each micro-batch split over ``"data"``.
    """
    leaves = jax.tree.leaves(batch)
    size = leaves[0].shape[0] if leaves and leaves[0].ndim else None
    for x in leaves:
        if x.ndim == 0 or x.shape[0] != size or size % n:
            raise ValueError(f"TrainConfig.grad_accum={n} needs every batch array to share a "
                             f"leading axis divisible by {n}; got shapes "
                             f"{[tuple(y.shape) for y in leaves]}")
    micro = jax.tree.map(lambda x: x.reshape(n, size // n, *x.shape[1:]), batch)
    if micro_sharding is not None:
        micro = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, micro_sharding(x)),
                             micro)
    first = jax.tree.map(lambda x: x[0], micro)
    (_, (m_shape, _)), g_shape = jax.eval_shape(grad_fn, params, rest, first, key)
    zeros = lambda t: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), t)  # noqa: E731

    def body(carry, xs):
        g_sum, m_sum, w_sum, rest = carry
        mb, i = xs
        (_, (m, rest)), g = grad_fn(params, rest, mb, jax.random.fold_in(key, i))
        w = _micro_weight(m)
        g_sum = jax.tree.map(lambda a, b: a + w * b, g_sum, g)
        m_sum = {k: m_sum[k] + (m[k] if k in COUNT_KEYS else w * m[k]) for k in m_sum}
        return (g_sum, m_sum, w_sum + w, rest), None

    init = (zeros(g_shape), zeros(m_shape), jnp.float32(0.0), rest)
    (g_sum, m_sum, w_sum, rest), _ = jax.lax.scan(body, init, (micro, jnp.arange(n)))
    scale = jnp.where(w_sum > 0, 1.0 / jnp.where(w_sum > 0, w_sum, 1.0), 0.0)
    grads = jax.tree.map(lambda g: (g * scale).astype(g.dtype), g_sum)
    metrics = {k: v if k in COUNT_KEYS else v * scale for k, v in m_sum.items()}
    return grads, metrics, rest


@dataclasses.dataclass(frozen=True)
class StepLayout:
    """Where the train step's inputs and outputs live on a mesh (hashable, so a cache key).

    Each of ``params``, ``rest``, ``opt_state`` and ``batch`` is a
    ``(treedef, shardings)`` pair: the tree's structure and one ``NamedSharding``
    per leaf (see :meth:`of`).
    """

    mesh: Mesh
    params: tuple
    rest: tuple
    opt_state: tuple
    batch: tuple

    @staticmethod
    def flat(shardings) -> tuple:
        """``(treedef, leaves)`` of a tree of ``NamedSharding``."""
        leaves, treedef = jax.tree.flatten(shardings)
        return treedef, tuple(leaves)

    def tree(self, name: str):
        treedef, leaves = getattr(self, name)
        return jax.tree.unflatten(treedef, leaves)

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())


@functools.lru_cache(maxsize=64)
def compiled_step(graphdef, loss_fn: Callable, config: TrainConfig, pass_rng: bool,
                  layout: StepLayout | None = None):
    """Returns the jitted ``step(params, rest, opt_state, batch, step, key)``.

    The result is ``(params, rest, opt_state, metrics)``: the updated states and
    a dict of float32 metrics (the loss's own, averaged over micro-batches, plus
    ``lr`` and ``grad_norm``, the global gradient norm before clipping). The
    input states are donated. With a ``layout`` the step is jitted with its
    shardings as ``in_shardings`` / ``out_shardings`` (``step`` and ``key``
    replicated, the metrics replicated).
    """
    tx = make_optimizer(config)
    schedule = make_schedule(config)
    grad_fn = jax.value_and_grad(_loss_and_state(graphdef, loss_fn, pass_rng, config.precision),
                                 has_aux=True)
    micro_sharding = None
    if layout is not None:
        def micro_sharding(x):
            return NamedSharding(layout.mesh, P(None, "data", *([None] * (x.ndim - 2))))

    def step_fn(params, rest, opt_state, batch, step, key):
        step_key = jax.random.fold_in(key, step)
        if config.grad_accum == 1:
            (_, (metrics, rest)), grads = grad_fn(params, rest, batch, step_key)
        else:
            grads, metrics, rest = _accumulate(grad_fn, params, rest, batch, step_key,
                                               config.grad_accum, micro_sharding)
        if layout is not None:
            grads = jax.lax.with_sharding_constraint(grads, layout.tree("params"))
        metrics = dict(metrics, grad_norm=optax.tree.norm(grads),
                       lr=jnp.asarray(schedule(step), jnp.float32))
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, rest, opt_state, metrics

    if layout is None:
        return jax.jit(step_fn, donate_argnums=(0, 1, 2))
    states = (layout.tree("params"), layout.tree("rest"), layout.tree("opt_state"))
    return jax.jit(step_fn, donate_argnums=(0, 1, 2),
                   in_shardings=(*states, layout.tree("batch"), layout.replicated,
                                 layout.replicated),
                   out_shardings=(*states, layout.replicated))


def step_config(config: TrainConfig) -> TrainConfig:
    """The config with the fields that do not change the step's numbers normalised."""
    return config.replace(seed=0, log_every=1, eval_every=0, checkpoint_every=0,
                          keep_checkpoints=1, progress=False)
