"""The vision tower of a VLM: Qwen3-VL's ViT (Bai et al. 2025, ``Qwen3VLVisionModel``) in
Flax NNX, on Lab's shared :class:`lab.nn.Block`.

Input is what Hugging Face's Qwen3-VL image processor returns: ``pixel_values [N,
C * Tp * P * P]``, one row per patch of ``Tp`` frames x ``P x P`` pixels, the patches
of each image listed block-major over its ``m x m`` merge blocks, and ``grid_thw [n,
3]`` (frames / Tp, patch rows, patch columns per image). The tower embeds each patch
with one linear map (Hugging Face's stride = kernel ``Conv3d``), adds a learned
position table bilinearly resampled to the image's grid (``align_corners=True``),
runs ``n_layers`` bidirectional pre-LayerNorm blocks with a 2-D rotary embedding of
the patch row and column, attention restricted to each frame, and merges every
``m x m`` patch block into one token of the decoder's width (LayerNorm, then a GELU
MLP on the ``m^2 D`` concatenation). DeepStack (Meng et al. 2024) taps the output of
chosen blocks through mergers of their own (norm after the concatenation).

``grid_thw`` is read on the host (numpy): it fixes every shape, so it must be
concrete (not traced) when the tower runs under ``jax.jit``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.nn.config import VisionConfig
from lab.nn.layers import LayerNorm, axial_angles
from lab.nn.transformer import Block


def check_grid(grid_thw, config: VisionConfig, name: str = "image_grid_thw") -> np.ndarray:
    """``grid_thw`` as an ``[n, 3]`` int64 numpy array; ValueError unless every entry is a
    positive int and the rows and columns are multiples of ``spatial_merge_size``."""
    if isinstance(grid_thw, jax.core.Tracer):
        raise ValueError(f"{name} is traced; it fixes the vision tower's shapes and must be a "
                         "concrete array (numpy, or a jax array outside jit)")
    grid = np.asarray(grid_thw)
    if grid.ndim != 2 or grid.shape[1] != 3 or grid.shape[0] == 0:
        raise ValueError(f"{name} has shape {grid.shape}; expected [n, 3] (frames, rows, "
                         "columns of patches per image), n >= 1")
    if not np.issubdtype(grid.dtype, np.integer) or grid.min() < 1:
        raise ValueError(f"{name}={grid.tolist()}; expected positive ints")
    m = config.spatial_merge_size
    if np.any(grid[:, 1:] % m):
        raise ValueError(f"{name}={grid.tolist()}: patch rows and columns must be multiples "
                         f"of VisionConfig.spatial_merge_size={m}")
    return grid.astype(np.int64)


def check_pixels(pixel_values, grid: np.ndarray, config: VisionConfig,
                 name: str = "pixel_values"):
    """Raises ValueError unless ``pixel_values`` is a float ``[sum(t*h*w), patch_dim]``."""
    shape = tuple(getattr(pixel_values, "shape", np.shape(pixel_values)))
    dtype = pixel_values.dtype if hasattr(pixel_values, "dtype") \
        else np.asarray(pixel_values).dtype
    n = int(np.prod(grid, axis=1).sum())
    if shape != (n, config.patch_dim):
        raise ValueError(f"{name} has shape {shape}; its grid_thw {grid.tolist()} needs "
                         f"({n}, {config.patch_dim}): one row per patch of in_channels x "
                         "temporal_patch_size x patch_size^2 = "
                         f"{config.in_channels} x {config.temporal_patch_size} x "
                         f"{config.patch_size}^2 pixels")
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{name} has dtype {dtype}; expected floating pixel values (the "
                         "processor's rescaled and normalised patches)")


def patchify(frames, *, patch_size: int, merge_size: int, temporal_patch_size: int = 1,
             mean=0.5, std=0.5) -> np.ndarray:
    """The tower's ``pixel_values`` of frames ``[T, H, W, C]`` (pixel values in ``[0, 255]``,
    uint8 or float) of one size: rescaled and normalised to ``(x / 255 - mean) / std``
    (per channel when ``mean``/``std`` are sequences), the last frame repeated up to a
    multiple of ``temporal_patch_size``, consecutive frames stacked into temporal patches,
    and flattened to float32 ``[T / Tp * H / P * W / P, C * Tp * P * P]``: the ``m x m``
    merge blocks of each temporal patch row by row, each block's patches row by row, each
    patch's values channel-major, then frame, then pixel row and column. This is the order
    of Qwen3-VL's processors (``Qwen3VLVideoProcessor.patchify``; an image is a clip of one
    frame repeated ``Tp`` times) that :func:`patch_positions` indexes. ValueError unless
    ``H`` and ``W`` are multiples of ``patch_size * merge_size``."""
    x = np.asarray(frames)
    p, m, tp = patch_size, merge_size, temporal_patch_size
    if x.ndim != 4 or len(x) == 0:
        raise ValueError(f"frames have shape {x.shape}; expected [T, H, W, C], T >= 1")
    t, h, w, c = x.shape
    if h % (p * m) or w % (p * m):
        raise ValueError(f"frames are {h}x{w} pixels; expected multiples of patch_size x "
                         f"merge_size = {p} x {m} = {p * m}")
    x = (x.astype(np.float32) / 255.0 - np.asarray(mean, np.float32)) / np.asarray(std,
                                                                                   np.float32)
    if pad := -t % tp:
        x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
    x = x.reshape(len(x) // tp, tp, h // (p * m), m, p, w // (p * m), m, p, c)
    x = x.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)      # [t, h/pm, w/pm, m, m, c, tp, p, p]
    return np.ascontiguousarray(x.reshape(-1, c * tp * p * p), np.float32)


def patch_positions(grid: np.ndarray, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of every patch ``[N]`` in the processor's block-major order (the
    ``m x m`` blocks of a frame row by row, each block's patches row by row), repeated over
    the frames (``transformers.vision_utils.get_vision_position_ids``)."""
    rows, cols = [], []
    for t, h, w in grid.tolist():
        r, c = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        shape = (h // merge, merge, w // merge, merge)
        rows.append(np.tile(r.reshape(shape).transpose(0, 2, 1, 3).reshape(-1), t))
        cols.append(np.tile(c.reshape(shape).transpose(0, 2, 1, 3).reshape(-1), t))
    return np.concatenate(rows), np.concatenate(cols)


def position_taps(grid: np.ndarray, merge: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``[N, 4]`` into the flattened ``side x side`` position table and bilinear
    weights ``[N, 4]`` that resample it to each image's patch grid (``F.interpolate`` with
    ``mode="bilinear", align_corners=True``, edges clamped)."""
    rows, cols = patch_positions(grid, merge)
    sizes = np.concatenate([np.full(t * h * w, h) for t, h, w in grid.tolist()])
    widths = np.concatenate([np.full(t * h * w, w) for t, h, w in grid.tolist()])

    def taps(index, size):
        src = (index.astype(np.float32) * np.float32(side - 1)
               / np.maximum(size - 1, 1).astype(np.float32))
        floor = np.floor(src)
        off = np.arange(2)
        idx = np.clip(floor.astype(np.int64)[:, None] + off, 0, side - 1)
        weight = np.clip(1 - np.abs(src[:, None] - floor[:, None] - off), 0, None)
        return idx, weight.astype(np.float32)

    hi, hw = taps(rows, sizes)
    wi, ww = taps(cols, widths)
    index = (hi[:, :, None] * side + wi[:, None, :]).reshape(-1, 4)
    weight = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4)
    return index, weight


class PatchMerger(nnx.Module):
    """LayerNorm, then ``fc2(gelu(fc1(.)))`` on each ``m x m`` patch block concatenated
    (``m^2 D -> m^2 D -> out_dim``, erf GELU); ``postshuffle``: the norm is over the
    concatenation (DeepStack's mergers) instead of each patch (the final merger)."""

    def __init__(self, config: VisionConfig, *, postshuffle: bool, rngs: nnx.Rngs):
        dt = config.jnp_dtype
        wide = config.d_model * config.spatial_merge_size ** 2
        init = nnx.initializers.normal(config.init_std)
        self.norm = LayerNorm(wide if postshuffle else config.d_model, eps=config.norm_eps,
                              dtype=dt)
        self.fc1 = nnx.Linear(wide, wide, param_dtype=dt, dtype=dt, kernel_init=init, rngs=rngs)
        self.fc2 = nnx.Linear(wide, config.out_dim, param_dtype=dt, dtype=dt, kernel_init=init,
                              rngs=rngs)
        self.postshuffle = postshuffle
        self.wide = wide

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [N, D]`` (block-major patches) -> ``[N / m^2, out_dim]``."""
        x = self.norm(x.reshape(-1, self.wide)) if self.postshuffle \
            else self.norm(x).reshape(-1, self.wide)
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class VisionEncoder(nnx.Module):
    """Qwen3-VL's ViT (see the module docstring): patches -> merged visual tokens."""

    def __init__(self, config: VisionConfig, *, rngs: nnx.Rngs):
        c = config
        dt = c.jnp_dtype
        init = nnx.initializers.normal(c.init_std)
        self.config = c
        self.patch_embed = nnx.Linear(c.patch_dim, c.d_model, param_dtype=dt, dtype=dt,
                                      kernel_init=init, rngs=rngs)
        if c.num_position_embeddings:
            self.pos_embed = nnx.Embed(c.num_position_embeddings, c.d_model, param_dtype=dt,
                                       dtype=dt, embedding_init=init, rngs=rngs)
        block = c.block_config()
        self.blocks = nnx.List([Block(block, rngs=rngs) for _ in range(c.n_layers)])
        self.merger = PatchMerger(c, postshuffle=False, rngs=rngs)
        self.deepstack_mergers = nnx.List([PatchMerger(c, postshuffle=True, rngs=rngs)
                                           for _ in c.deepstack_layers])

    def __call__(self, pixel_values: jax.Array, grid_thw) -> tuple[jax.Array, jax.Array | None]:
        """Encodes ``pixel_values [N, patch_dim]`` of images with patch grids ``grid_thw [n, 3]``.

        Returns ``(tokens [N / m^2, out_dim], deepstack [K, N / m^2, out_dim] or None)``,
        the images' tokens in order. Raises ValueError for a bad grid or pixel array.
        """
        c = self.config
        grid = check_grid(grid_thw, c)
        check_pixels(pixel_values, grid, c)
        x = self.patch_embed(jnp.asarray(pixel_values).astype(c.jnp_dtype))      # [N, D]
        m = c.spatial_merge_size
        if c.num_position_embeddings:
            side = int(round(c.num_position_embeddings ** 0.5))
            index, weight = position_taps(grid, m, side)
            table = self.pos_embed.embedding[...]
            x = x + jnp.einsum("nk,nkd->nd", jnp.asarray(weight, table.dtype),
                               table[jnp.asarray(index)]).astype(x.dtype)
        n, d = x.shape
        rope = None
        if c.rope:
            rows, cols = patch_positions(grid, m)
            rope = axial_angles(jnp.asarray(rows), jnp.asarray(cols), c.head_dim, c.rope_theta)
        # Attention stays within a frame: equal frames run as rows of a batch; frames of
        # different sizes as one row with a block-diagonal mask.
        frames = np.repeat(grid[:, 1] * grid[:, 2], grid[:, 0])
        mask = None
        if np.all(frames == frames[0]):
            shape = (len(frames), int(frames[0]))
        else:
            shape = (1, n)
            seg = jnp.asarray(np.repeat(np.arange(len(frames)), frames))
            mask = (seg[:, None] == seg[None, :])[None, None]
        x = x.reshape(*shape, d)
        if rope is not None:
            rope = rope.reshape(*shape, -1)
        positions = jnp.zeros(shape, jnp.int32)
        taps = []
        for i, block in enumerate(self.blocks):
            x, _, _ = block(x, positions=positions, mask=mask, rope=rope)
            if i in c.deepstack_layers:
                taps.append(self.deepstack_mergers[c.deepstack_layers.index(i)](x.reshape(n, d)))
        out = self.merger(x.reshape(n, d))
        return out, (jnp.stack(taps) if taps else None)
