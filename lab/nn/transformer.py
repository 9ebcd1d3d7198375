"""The decoder-only Transformer of the Qwen3 / Qwen2 / Llama family, in Flax NNX.

One block, :meth:`Block.__call__`, serves every use: plain logits, logits with
intermediates (residual stream, attention probabilities, their column sums, the
rotated queries), continuous inputs (``inputs_embeds``), prefill on a
:class:`KVCache` (``cache=``) and the jitted decode loop of :mod:`lab.infer`,
which calls :meth:`Transformer.blocks` one token at a time. The cache's stored
positions give both the causal mask and, through the keys stored after RoPE,
the rotary phases.

Parameter names follow Hugging Face's where the layout is the same (``embed``,
``layers[i].attn.o``, ``layers[i].mlp.down``, the norms, ``lm_head``); q/k/v
(``attn.qkv``) and gate/up (``mlp.gate_up``) are fused, and ``lab.hf`` splits
them into Hugging Face's tensors on save and fuses them on load.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kernels_pallas import attention as attention_kernels
from lab.nn.cache import KVCache, LayerKV, check_cache, write
from lab.nn.config import TransformerConfig
from lab.nn.layers import (
    Fused,
    GeluMLP,
    LayerNorm,
    RMSNorm,
    SwiGLU,
    apply_rope,
    causal_smear,
    last_tokens,
    mrope_angles,
    normal_kernels,
    rotate,
)

CAPTURES = ("hidden", "attn", "attn_colsum", "queries", "mlp")
# Initial q/k smear weight. Not 0: the query-key match through the smear is a
# product of the two weights, whose gradient vanishes at 0 (a saddle); docs/zoo.md
# has the measurement on token MQAR.
SMEAR_INIT = 0.3


class Intermediates(NamedTuple):
    """What ``capture=`` asked for (None otherwise).

    hidden:      ``[L+1, B, T, D]`` residual stream: the embeddings, then the
                 output of each block (before the final norm; Hugging Face's
                 ``output_hidden_states`` differs only in its last entry, which
                 it returns after the final norm).
    attn:        ``[L, B, H, T, S]`` attention probabilities (float32).
    attn_colsum: ``[L, B, H, S]`` their sums over the queries.
    queries:     ``[L, B, H, T, hd]`` the queries after smear, q-norm and RoPE (what
                 SnapKV/TOVA/PRKV score the cache with).
    mlp:         ``[L, B, T, F]`` the MLP neurons' activations as the down projection
                 reads them (after ``neuron_scale``).
    """

    hidden: jax.Array | None = None
    attn: jax.Array | None = None
    attn_colsum: jax.Array | None = None
    queries: jax.Array | None = None
    mlp: jax.Array | None = None


def check_tokens(tokens, vocab_size: int, name: str = "tokens") -> None:
    """Raises ValueError for concrete token ids outside ``[0, vocab_size)``."""
    if isinstance(tokens, jax.core.Tracer):
        return
    arr = np.asarray(tokens)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be integer token ids, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        bad = arr.max() if arr.max() >= vocab_size else arr.min()
        raise ValueError(f"{name} contains id {int(bad)} outside the vocabulary [0, {vocab_size})")


class Attention(nnx.Module):
    """Grouped-query attention with optional q/k RMSNorm (Qwen3), qkv bias (Qwen2) and
    q/k smear; q, k and v are one fused projection.

    ``qkv.kernel [D, Hkv, G + 2, hd]`` (``G = n_heads // n_kv_heads``) is grouped by KV
    head: ``[:, j, :G]`` are the query heads ``j*G .. j*G + G - 1`` that share KV head
    ``j`` (Hugging Face's ``repeat_kv`` order), ``[:, j, G]`` its key, ``[:, j, G + 1]``
    its value. One matmul serves all three, and splitting the KV-head axis over a
    mesh keeps each device's queries, keys and values together.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        c = config
        dt = c.jnp_dtype
        kv, hd = c.n_kv_heads, c.head_dim
        parts, biases = [], []
        for width in (c.n_heads * hd, kv * hd, kv * hd):  # nnx.Linear's key order: q, k, v
            parts += normal_kernels(rngs, c.init_std, c.d_model, (width,), dt)
            if c.qkv_bias:
                rngs.params()
                biases.append(jnp.zeros((width,), dt))
        kernel = fuse_qkv(*parts, config=c)
        bias = fuse_qkv(*(b[None] for b in biases), config=c)[0] if c.qkv_bias else None
        self.qkv = Fused(kernel, bias, dtype=dt)
        self.o = nnx.Linear(c.n_heads * hd, c.d_model, use_bias=c.o_bias, param_dtype=dt, dtype=dt,
                            kernel_init=nnx.initializers.normal(c.init_std), rngs=rngs)
        if c.qk_norm:
            self.q_norm = RMSNorm(hd, eps=c.norm_eps, dtype=dt)
            self.k_norm = RMSNorm(hd, eps=c.norm_eps, dtype=dt)
        if c.qk_smear:
            self.q_smear = nnx.Param(jnp.full((c.qk_smear, c.n_heads, hd), SMEAR_INIT, dt))
            self.k_smear = nnx.Param(jnp.full((c.qk_smear, kv, hd), SMEAR_INIT, dt))
        self.config = c

    def qkv_raw(self, x: jax.Array):
        """Raw projections ``q [B, T, H, hd]``, ``k, v [B, T, Hkv, hd]`` (one matmul)."""
        c = self.config
        b, t, _ = x.shape
        g = c.group_size
        qkv = self.qkv(x)                                          # [B, T, Hkv, G + 2, hd]
        return (qkv[:, :, :, :g].reshape(b, t, c.n_heads, c.head_dim),
                qkv[:, :, :, g], qkv[:, :, :, g + 1])

    def rotate(self, q, k, positions, *, src_positions=None, tail=None, tail_positions=None,
               rope=None):
        """Raw ``q [B, T, H, hd]``, ``k [B, T, Hkv, hd]`` -> smeared (``qk_smear``), normed
        (``qk_norm``) and rotated ``q [B, H, T, hd]``, ``k [B, Hkv, T, hd]``.

        ``rope [B, T, hd/2]``: the rotary angles of each token (M-RoPE, 2-D vision
        rope); default: the 1-D RoPE of ``positions``.

        ``tail [B, S, H + Hkv, hd]`` at ``tail_positions [B, S]`` holds the raw q/k of
        the tokens before these (a decode cache's :attr:`KVCache.qk_tail`);
        ``src_positions`` marks padding (-1) that is never smeared in.
        """
        c = self.config
        if c.qk_smear:
            if tail is None:
                tail = jnp.zeros((q.shape[0], c.qk_smear, c.n_heads + c.n_kv_heads, c.head_dim),
                                 q.dtype)
                tail_positions = jnp.full((q.shape[0], c.qk_smear), -1, jnp.int32)
            smear = functools.partial(causal_smear, positions=positions,
                                      prev_positions=tail_positions, src_positions=src_positions)
            q = smear(q, weights=self.q_smear[...], prev=tail[:, :, :c.n_heads])
            k = smear(k, weights=self.k_smear[...], prev=tail[:, :, c.n_heads:])
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is None:
            q = apply_rope(q, positions, c.rope_theta)
            k = apply_rope(k, positions, c.rope_theta)
        else:
            q, k = rotate(q, rope), rotate(k, rope)
        return q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)

    def attend(self, q, k, v, mask, bias, *, probs: bool, colsum: bool, causal: bool = False):
        """Attention output ``[B, T, D]`` projected by ``o``, and the requested statistics.

        ``causal``: query ``i`` may also only see key index ``<= i`` (``T == S``), which lets
        the kernels skip the upper triangle; ``mask`` still applies."""
        c = self.config
        if probs:  # probabilities need the materialised reference path
            out, cs, p = attention_kernels.reference(q, k, v, mask=mask, bias=bias,
                                                     causal=causal, return_colsum=True,
                                                     return_probs=True)
        elif colsum:
            out, cs = attention_kernels.attention(q, k, v, mask=mask, bias=bias, causal=causal,
                                                  return_colsum=True, impl=c.attention_impl)
            p = None
        else:
            out = attention_kernels.attention(q, k, v, mask=mask, bias=bias, causal=causal,
                                              impl=c.attention_impl)
            cs = p = None
        b, h, t, d = out.shape
        out = self.o(out.transpose(0, 2, 1, 3).reshape(b * t, h * d)).reshape(b, t, -1)
        return out, cs, p


def fuse_qkv(q: jax.Array, k: jax.Array, v: jax.Array, *, config: TransformerConfig):
    """``q [D, H*hd]``, ``k, v [D, Hkv*hd]`` (NNX ``[in, out]`` kernels, heads in Hugging
    Face's order) -> the fused ``[D, Hkv, G + 2, hd]`` of :class:`Attention`."""
    c = config
    d = q.shape[0]
    return jnp.concatenate([q.reshape(d, c.n_kv_heads, c.group_size, c.head_dim),
                            k.reshape(d, c.n_kv_heads, 1, c.head_dim),
                            v.reshape(d, c.n_kv_heads, 1, c.head_dim)], axis=2)


def split_qkv(qkv: jax.Array, *, config: TransformerConfig):
    """The inverse of :func:`fuse_qkv`: ``(q [D, H*hd], k [D, Hkv*hd], v [D, Hkv*hd])``."""
    c = config
    d, g = qkv.shape[0], c.group_size
    return (qkv[:, :, :g].reshape(d, -1), qkv[:, :, g].reshape(d, -1),
            qkv[:, :, g + 1].reshape(d, -1))


def make_norm(config: TransformerConfig, dim: int | None = None):
    """The block's norm of ``config.norm``: RMSNorm or LayerNorm (width ``dim``, default
    ``d_model``)."""
    cls = RMSNorm if config.norm == "rmsnorm" else LayerNorm
    return cls(dim or config.d_model, eps=config.norm_eps, dtype=config.jnp_dtype)


class Block(nnx.Module):
    """One pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``, then the
    optional residual-stream ``edit`` (None unless :func:`lab.nn.edit_residual` set one).

    :meth:`__call__` is the only implementation of attention + MLP in Lab: the full
    forward, prefill on a cache, the jitted decode loop, every capture and the vision
    tower's bidirectional blocks (``norm="layernorm"``, ``mlp="gelu_tanh"``) run it.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        dt = config.jnp_dtype
        self.attn_norm = make_norm(config)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = make_norm(config)
        if config.mlp == "swiglu":
            self.mlp = SwiGLU(config.d_model, config.d_ff, dtype=dt, init_std=config.init_std,
                              rngs=rngs)
        else:
            self.mlp = GeluMLP(config.d_model, config.d_ff, approximate=config.mlp == "gelu_tanh",
                               dtype=dt, init_std=config.init_std, rngs=rngs)
        # An optional module applied to the block's output residual stream (``x -> x``),
        # attached to a copy of the model by :func:`lab.nn.edit_residual`.
        self.edit = None
        self.config = config

    def __call__(self, x: jax.Array, *, positions: jax.Array, key_positions=None,
                 cache: LayerKV | None = None, slot=None, mask=None, bias=None,
                 capture: Sequence[str] = (), fresh: bool = False, rope=None,
                 neuron_scale=None):
        """Runs the block on ``x [B, T, D]``.

        Args:
          positions: ``[B, T]`` int32 positions of the queries (-1 = padding: attends
            to nothing).
          key_positions: ``[B, T]`` positions under which these tokens are stored as
            keys (-1 = padding, never attended); default ``positions``.
          cache: this layer's :class:`LayerKV`; the new keys/values are written at
            ``slot [B]`` and the queries attend to every valid cached entry at a
            position ``<=`` their own. Without a cache they attend to ``x`` itself
            (causally by index and position when ``config.causal``).
          mask: boolean, broadcastable to ``[B, 1|Hkv|H, T, S]`` (True = may attend),
            combined with the above; bias: additive, broadcastable to ``[B, H, T, S]``.
          capture: any of ``"attn"``, ``"attn_colsum"``, ``"queries"``.
          fresh: the cache holds nothing before ``slot`` (a prompt's prefill, ``slot``
            0, capacity ``T``): the queries attend to ``x``'s own keys, as without a
            cache, so attention can skip the causal upper triangle; the keys and
            values are still written.
          rope: ``[B, T, hd/2]`` rotary angles replacing the 1-D RoPE of ``positions``
            (which still give the mask and the cache's stored positions).
          neuron_scale: multiplies the MLP neurons' activations, broadcastable to
            ``[B, T, F]`` (None = the plain MLP, unchanged).

        Returns:
          ``(x [B, T, D], cache or None, {"attn", "attn_colsum", "queries", "mlp"})``:
          the captured entries are ``[B, H, T, S]``, ``[B, H, S]``, ``[B, H, T, hd]``
          (queries after smear, q-norm and RoPE) and ``[B, T, F]`` (the neurons'
          activations after ``neuron_scale``), None unless asked.
        """
        c = self.config
        kpos = positions if key_positions is None else key_positions
        qr, kr, v = self.attn.qkv_raw(self.attn_norm(x))
        tail = cache.qk_tail if cache is not None and c.qk_smear else None
        q, k = self.attn.rotate(qr, kr, positions, src_positions=kpos, tail=tail,
                                tail_positions=None if tail is None else cache.tail_positions,
                                rope=rope)
        v = v.transpose(0, 2, 1, 3)
        if cache is not None:
            tail_pos = cache.tail_positions
            if tail is not None:
                tail, tail_pos = last_tokens(tail, cache.tail_positions,
                                             jnp.concatenate([qr, kr], axis=2), kpos)
            keys, values, stored = write(cache.keys, cache.values, cache.positions, slot, k, v,
                                         kpos)
            cache = LayerKV(keys, values, stored, tail, tail_pos)
        if cache is not None and not fresh:
            k, v, kp = cache.keys, cache.values, cache.positions[:, :, None, :]  # [B, Hkv, 1, C]
            index_causal = False
        else:
            kp = kpos[:, None, None, :]                               # [B, 1, 1, T]
            # Without a cache the keys are these tokens: causality by index too (as
            # Hugging Face masks), which equals the positional mask for any in-order
            # positions (packed rows included) and lets attention skip the upper triangle.
            index_causal = c.causal
        allowed = kp >= 0
        if c.causal:
            allowed = allowed & (kp <= positions[:, None, :, None])
        if mask is not None:
            allowed = allowed & mask
        out, cs, p = self.attn.attend(q, k, v, allowed, bias, probs="attn" in capture,
                                      colsum="attn_colsum" in capture, causal=index_causal)
        x = x + out
        act = None
        if neuron_scale is None and "mlp" not in capture:
            x = x + self.mlp(self.mlp_norm(x))
        else:
            act = self.mlp.neurons(self.mlp_norm(x))
            if neuron_scale is not None:
                act = act * jnp.asarray(neuron_scale).astype(act.dtype)
            x = x + self.mlp.project(act)
        if self.edit is not None:
            x = self.edit(x)
        return x, cache, {"attn": p, "attn_colsum": cs,
                          "queries": q if "queries" in capture else None,
                          "mlp": act if "mlp" in capture else None}


class Transformer(nnx.Module):
    """Decoder-only LM: embeddings, ``n_layers`` pre-norm blocks, final RMSNorm, LM head."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        dt = config.jnp_dtype
        self.embed = nnx.Embed(config.vocab_size, config.d_model, param_dtype=dt, dtype=dt,
                               embedding_init=nnx.initializers.normal(config.init_std), rngs=rngs)
        self.layers = nnx.List([Block(config, rngs=rngs) for _ in range(config.n_layers)])
        self.norm = RMSNorm(config.d_model, eps=config.norm_eps, dtype=dt)
        if not config.tie_embeddings:
            self.lm_head = nnx.Linear(config.d_model, config.vocab_size, use_bias=False,
                                      param_dtype=dt, dtype=dt,
                                      kernel_init=nnx.initializers.normal(config.init_std),
                                      rngs=rngs)

    def embed_tokens(self, tokens: jax.Array) -> jax.Array:
        """Token embeddings ``[B, T, D]`` (what ``inputs_embeds`` replaces)."""
        check_tokens(tokens, self.config.vocab_size)
        return self.embed(tokens)

    def unembed(self, h: jax.Array) -> jax.Array:
        """Final norm and LM head: residual stream ``[..., D]`` -> float32 logits ``[..., V]``."""
        h = self.norm(h)
        if self.config.tie_embeddings:
            return self.embed.attend(h).astype(jnp.float32)
        return self.lm_head(h).astype(jnp.float32)

    def blocks(self, x: jax.Array, *, positions: jax.Array, key_positions=None, caches=None,
               slot=None, mask=None, bias=None, capture: Sequence[str] = (),
               fresh: bool = False, rope=None, deepstack=None, neuron_scale=None):
        """Runs every :class:`Block` on the residual stream ``x [B, T, D]``.

        ``caches``: one :class:`LayerKV` per layer (or None), written at ``slot [B]``.
        ``rope [B, T, hd/2]``: rotary angles for every block (default: from ``positions``).
        ``deepstack [K, B, T, D]``: added to the residual stream after block ``k < K``
        (DeepStack's visual features, zero at text tokens).
        ``neuron_scale``: per layer, a factor on the MLP neurons' activations: an array
        whose entry ``[i]`` broadcasts to ``[B, T, F]`` (``[L, F]``, ``[L, B, 1, F]``,
        ...), or a sequence of such arrays / None per layer; None = unchanged.
        Returns ``(x, caches or None, Intermediates)`` (see :meth:`__call__` for the
        other arguments; ``capture`` may also hold ``"hidden"``).
        """
        hidden, out = [x], {"attn": [], "attn_colsum": [], "queries": [], "mlp": []}
        new = []
        for i, layer in enumerate(self.layers):
            x, lc, got = layer(x, positions=positions, key_positions=key_positions,
                               cache=None if caches is None else caches[i], slot=slot,
                               mask=mask, bias=bias, capture=capture, fresh=fresh, rope=rope,
                               neuron_scale=None if neuron_scale is None else neuron_scale[i])
            if deepstack is not None and i < deepstack.shape[0]:
                x = x + deepstack[i].astype(x.dtype)
            new.append(lc)
            hidden.append(x)
            for name in out:
                out[name].append(got[name])
        inter = Intermediates(
            hidden=jnp.stack(hidden) if "hidden" in capture else None,
            **{name: jnp.stack(v) if name in capture else None for name, v in out.items()})
        return x, (tuple(new) if caches is not None else None), inter

    def __call__(self, tokens: jax.Array | None = None, *, inputs_embeds: jax.Array | None = None,
                 positions: jax.Array | None = None, mask: jax.Array | None = None,
                 bias: jax.Array | None = None, capture: Sequence[str] = (),
                 cache: KVCache | None = None, fresh: bool = False,
                 rope_positions: jax.Array | None = None, deepstack: jax.Array | None = None,
                 neuron_scale=None, last_only: bool = False):
        """Runs the model.

        Args:
          tokens: ``[B, T]`` int ids (or give ``inputs_embeds [B, T, D]``).
          positions: ``[B, T]`` token positions (default ``arange(T)``, or
            ``cache.next_positions + arange(T)`` when decoding on a cache).
          mask: ``[B, T]`` boolean token validity (False = padding, never
            attended), or a full boolean mask broadcastable to
            ``[B, 1|Hkv|H, T, S]`` (True = may attend), combined with causality.
          bias: additive attention bias broadcastable to ``[B, H, T, S]``.
          capture: any of :data:`CAPTURES` (see :class:`Intermediates`).
          cache: a :class:`KVCache`; the new keys/values are written at
            ``cache.length`` and the queries attend to every valid entry.
          fresh: with an empty ``cache`` of capacity ``T``: attend as without a
            cache (see :meth:`Block.__call__`); the numbers are the same.
          rope_positions: ``[3, B, T]`` M-RoPE (temporal, height, width) positions of
            a model with ``config.mrope_section`` (:func:`lab.nn.layers.mrope_angles`);
            ``positions`` still give the mask and the cache's stored positions.
            Default: every row equal to ``positions`` (the plain RoPE).
          deepstack: ``[K, B, T, D]`` added to the residual stream after each of the
            first ``K`` blocks (Qwen3-VL's DeepStack visual features).
          neuron_scale: a factor on each layer's MLP neuron activations (see
            :meth:`blocks`; :func:`lab.nn.scale_neurons` folds a fixed one into the
            weights for :mod:`lab.infer`). None: the model as it is.
          last_only: unembed the last position only, so ``logits`` is ``[B, 1, V]``: a
            prompt's next-token scores without the ``T x V`` logits of every position
            (with right padding, the last column is padding for the shorter rows).

        Returns:
          ``logits [B, T, V]`` (float32); ``(logits, Intermediates)`` when
          ``capture`` is set; with ``cache``, ``(logits, cache)`` or
          ``(logits, cache, Intermediates)``.
        """
        c = self.config
        capture = tuple(capture)
        for name in capture:
            if name not in CAPTURES:
                raise ValueError(f"capture={name!r} is unknown; expected any of {CAPTURES}")
        if (tokens is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of tokens or inputs_embeds")
        if neuron_scale is not None and len(neuron_scale) != c.n_layers:
            raise ValueError(f"neuron_scale has {len(neuron_scale)} layers; expected "
                             f"n_layers={c.n_layers} (one factor array per layer)")
        x = self.embed_tokens(tokens) if tokens is not None else inputs_embeds.astype(c.jnp_dtype)
        b, t, _ = x.shape
        if cache is None and t > c.max_len:
            raise ValueError(f"sequence length {t} exceeds TransformerConfig.max_len={c.max_len}")
        if cache is not None:
            check_cache(cache, c)
        if cache is not None and cache.capacity < t:
            raise ValueError(f"{t} new tokens exceed the KV cache capacity {cache.capacity}")
        if positions is None:
            start = cache.next_positions if cache is not None else jnp.zeros((b,), jnp.int32)
            positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
        positions = jnp.broadcast_to(positions, (b, t)).astype(jnp.int32)

        token_valid, full_mask = None, None
        if mask is not None:
            mask = jnp.asarray(mask, bool)
            if mask.ndim == 2:
                token_valid = mask
            else:
                full_mask = mask
        key_pos = positions if token_valid is None else jnp.where(token_valid, positions, -1)
        rope = None
        if rope_positions is not None:
            if c.mrope_section is None:
                raise ValueError("rope_positions given but TransformerConfig.mrope_section is "
                                 "None; only an M-RoPE model takes [3, B, T] positions")
            rp = jnp.asarray(rope_positions)
            if rp.shape != (3, b, t):
                raise ValueError(f"rope_positions has shape {rp.shape}; expected (3, {b}, {t})")
            rope = mrope_angles(rp, c.head_dim, c.rope_theta, c.mrope_section)
        x, caches, inter = self.blocks(
            x, positions=positions, key_positions=key_pos,
            caches=None if cache is None else cache.layers(),
            slot=None if cache is None else cache.length, mask=full_mask, bias=bias,
            capture=capture, fresh=fresh and cache is not None, rope=rope, deepstack=deepstack,
            neuron_scale=neuron_scale)
        logits = self.unembed(x[:, -1:] if last_only else x)
        if cache is not None:
            n_new = jnp.sum(key_pos >= 0, axis=1).astype(jnp.int32) if token_valid is not None \
                else jnp.full((b,), t, jnp.int32)
            cache = KVCache.from_layers(caches, cache.length + n_new, cache.next_positions + n_new)
            return (logits, cache, inter) if capture else (logits, cache)
        return (logits, inter) if capture else logits

    def embed_inputs(self, tokens: jax.Array) -> jax.Array:
        """Alias of :meth:`embed_tokens`."""
        return self.embed_tokens(tokens)
