"""The decoder-only Transformer of the Qwen3 / Qwen2 / Llama family, in Flax NNX.

One forward serves every use: plain logits, logits with intermediates
(residual stream, attention probabilities, their column sums), continuous
inputs (``inputs_embeds``), and incremental decoding on a :class:`KVCache`
(``cache=``), whose stored positions give both the causal mask and, through
the keys stored after RoPE, the rotary phases.

Parameter names follow Hugging Face's (``embed``, ``layers[i].attn.{q,k,v,o}``,
``layers[i].mlp.{gate,up,down}``, ``norm``, ``lm_head``) so that ``lab.hf`` maps
checkpoints one to one.
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
from lab.nn.cache import KVCache, check_cache, write
from lab.nn.config import TransformerConfig
from lab.nn.layers import RMSNorm, SwiGLU, apply_rope, causal_smear, last_tokens

CAPTURES = ("hidden", "attn", "attn_colsum")
# Initial q/k smear weight. Not 0: the query-key match through the smear is a
# product of the two weights, whose gradient vanishes at 0 (a saddle). On token
# MQAR with a separator, a 2-layer model initialised at 0 was at 0.105 after
# 1,500 steps; at 0.3 it reached 0.95 at 1,000.
SMEAR_INIT = 0.3


class Intermediates(NamedTuple):
    """What ``capture=`` asked for (None otherwise).

    hidden:      ``[L+1, B, T, D]`` residual stream: the embeddings, then the
                 output of each block (before the final norm; Hugging Face's
                 ``output_hidden_states`` differs only in its last entry, which
                 it returns after the final norm).
    attn:        ``[L, B, H, T, S]`` attention probabilities (float32).
    attn_colsum: ``[L, B, H, S]`` their sums over the queries.
    """

    hidden: jax.Array | None = None
    attn: jax.Array | None = None
    attn_colsum: jax.Array | None = None


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
    """Grouped-query attention with optional q/k RMSNorm (Qwen3) and qkv bias (Qwen2)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        c = config
        dt = c.jnp_dtype
        init = nnx.initializers.normal(c.init_std)

        def linear(din, dout, bias):
            return nnx.Linear(din, dout, use_bias=bias, param_dtype=dt, dtype=dt,
                              kernel_init=init, rngs=rngs)

        self.q = linear(c.d_model, c.n_heads * c.head_dim, c.qkv_bias)
        self.k = linear(c.d_model, c.n_kv_heads * c.head_dim, c.qkv_bias)
        self.v = linear(c.d_model, c.n_kv_heads * c.head_dim, c.qkv_bias)
        self.o = linear(c.n_heads * c.head_dim, c.d_model, False)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, eps=c.norm_eps, dtype=dt)
            self.k_norm = RMSNorm(c.head_dim, eps=c.norm_eps, dtype=dt)
        if c.qk_smear:
            self.q_smear = nnx.Param(jnp.full((c.qk_smear, c.n_heads, c.head_dim), SMEAR_INIT, dt))
            self.k_smear = nnx.Param(jnp.full((c.qk_smear, c.n_kv_heads, c.head_dim),
                                              SMEAR_INIT, dt))
        self.config = c

    def qkv(self, x: jax.Array):
        """Raw projections ``q [B, T, H, hd]``, ``k, v [B, T, Hkv, hd]``."""
        c = self.config
        b, t, _ = x.shape
        x = x.reshape(b * t, -1)  # 2-D matmuls: see SwiGLU
        return (self.q(x).reshape(b, t, c.n_heads, c.head_dim),
                self.k(x).reshape(b, t, c.n_kv_heads, c.head_dim),
                self.v(x).reshape(b, t, c.n_kv_heads, c.head_dim))

    def rotate(self, q, k, positions, *, src_positions=None, tail=None, tail_positions=None):
        """Raw ``q [B, T, H, hd]``, ``k [B, T, Hkv, hd]`` -> smeared (``qk_smear``), normed
        (``qk_norm``) and rotated ``q [B, H, T, hd]``, ``k [B, Hkv, T, hd]``.

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
        q = apply_rope(q, positions, c.rope_theta)
        k = apply_rope(k, positions, c.rope_theta)
        return q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)

    def project(self, x: jax.Array, positions: jax.Array, src_positions=None):
        """Returns ``q [B, H, T, hd]``, ``k, v [B, Hkv, T, hd]``; q and k smeared over the
        previous tokens of ``x`` (``qk_smear``) and rotated by position."""
        q, k, v = self.qkv(x)
        q, k = self.rotate(q, k, positions, src_positions=src_positions)
        return q, k, v.transpose(0, 2, 1, 3)

    def attend(self, q, k, v, mask, bias, *, probs: bool, colsum: bool, causal: bool = False):
        """Attention output ``[B, T, H*hd]`` projected by ``o``, and the requested statistics.

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


class Block(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        dt = config.jnp_dtype
        self.attn_norm = RMSNorm(config.d_model, eps=config.norm_eps, dtype=dt)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model, eps=config.norm_eps, dtype=dt)
        self.mlp = SwiGLU(config.d_model, config.d_ff, dtype=dt, init_std=config.init_std,
                          rngs=rngs)


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

    def __call__(self, tokens: jax.Array | None = None, *, inputs_embeds: jax.Array | None = None,
                 positions: jax.Array | None = None, mask: jax.Array | None = None,
                 bias: jax.Array | None = None, capture: Sequence[str] = (),
                 cache: KVCache | None = None):
        """Runs the model.

        Args:
          tokens: ``[B, T]`` int ids (or give ``inputs_embeds [B, T, D]``).
          positions: ``[B, T]`` token positions (default ``arange(T)``, or
            ``cache.length + arange(T)`` when decoding on a cache).
          mask: ``[B, T]`` boolean token validity (False = padding, never
            attended), or a full boolean mask broadcastable to
            ``[B, 1|Hkv|H, T, S]`` (True = may attend), combined with causality.
          bias: additive attention bias broadcastable to ``[B, H, T, S]``.
          capture: any of ``"hidden"``, ``"attn"``, ``"attn_colsum"``.
          cache: a :class:`KVCache`; the new keys/values are written at
            ``cache.length`` and the queries attend to every valid entry.

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
        x = self.embed_tokens(tokens) if tokens is not None else inputs_embeds.astype(c.jnp_dtype)
        b, t, _ = x.shape
        if cache is None and t > c.max_len:
            raise ValueError(f"sequence length {t} exceeds TransformerConfig.max_len={c.max_len}")
        if cache is not None:
            check_cache(cache, c)
        if cache is not None and cache.capacity < t:
            raise ValueError(f"{t} new tokens exceed the KV cache capacity {cache.capacity}")
        if positions is None:
            start = cache.length if cache is not None else jnp.zeros((b,), jnp.int32)
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

        hidden, attns, colsums = [x], [], []
        want_p, want_cs = "attn" in capture, "attn_colsum" in capture
        new_k, new_v, new_p, new_tail = [], [], [], []
        tail_pos = None
        for i, layer in enumerate(self.layers):
            qr, kr, v = layer.attn.qkv(layer.attn_norm(x))
            tail = cache.qk_tail[i] if cache is not None and c.qk_smear else None
            q, k = layer.attn.rotate(qr, kr, positions, src_positions=key_pos, tail=tail,
                                     tail_positions=None if tail is None else cache.tail_positions)
            v = v.transpose(0, 2, 1, 3)
            if tail is not None:
                tail, tail_pos = last_tokens(tail, cache.tail_positions,
                                             jnp.concatenate([qr, kr], axis=2), key_pos)
                new_tail.append(tail)
            if cache is not None:
                kc, vc, pc = write(cache.keys[i], cache.values[i], cache.positions[i],
                                   cache.length, k, v, key_pos)
                new_k.append(kc), new_v.append(vc), new_p.append(pc)
                k, v, kpos = kc, vc, pc  # [B, Hkv, C, ...]
                allowed = kpos[:, :, None, :] >= 0
                if c.causal:
                    allowed &= kpos[:, :, None, :] <= positions[:, None, :, None]
            else:
                allowed = (key_pos >= 0)[:, None, None, :]
                if c.causal:
                    allowed = allowed & (key_pos[:, None, None, :] <= positions[:, None, :, None])
            if full_mask is not None:
                allowed = allowed & full_mask
            # Without a cache the keys are these tokens: causality by index too (as Hugging
            # Face masks), which equals the positional mask for any in-order positions
            # (packed rows included) and lets attention skip the upper triangle.
            out, cs, p = layer.attn.attend(q, k, v, allowed, bias, probs=want_p, colsum=want_cs,
                                           causal=c.causal and cache is None)
            x = x + out
            x = x + layer.mlp(layer.mlp_norm(x))
            hidden.append(x)
            attns.append(p)
            colsums.append(cs)

        logits = self.unembed(x)
        inter = Intermediates(
            hidden=jnp.stack(hidden) if "hidden" in capture else None,
            attn=jnp.stack(attns) if want_p else None,
            attn_colsum=jnp.stack(colsums) if want_cs else None,
        )
        if cache is not None:
            n_new = jnp.sum(key_pos >= 0, axis=1).astype(jnp.int32) if token_valid is not None \
                else jnp.full((b,), t, jnp.int32)
            cache = KVCache(jnp.stack(new_k), jnp.stack(new_v), jnp.stack(new_p),
                            cache.length + n_new,
                            jnp.stack(new_tail) if new_tail else None, tail_pos)
            return (logits, cache, inter) if capture else (logits, cache)
        return (logits, inter) if capture else logits

    def embed_inputs(self, tokens: jax.Array) -> jax.Array:
        """Alias of :meth:`embed_tokens` (the issue's ``model.embed(tokens)``)."""
        return self.embed_tokens(tokens)
