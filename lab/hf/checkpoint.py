"""Load and save Qwen3 / Qwen2 / Llama safetensors checkpoints as :class:`lab.nn.Transformer`.

A checkpoint directory holds ``config.json`` and either ``model.safetensors`` or
a sharded ``model.safetensors.index.json`` with the shards it names (the layout
``transformers``' ``save_pretrained`` writes). Tensors are read through
safetensors' numpy API, so loading needs no torch. Hugging Face ``nn.Linear``
weights are ``[out, in]``; NNX ``Linear`` kernels are ``[in, out]``, so every
projection is transposed on the way in and out. Lab's fused projections
(``attn.qkv`` and ``mlp.gate_up``) are assembled from ``q/k/v_proj`` and
``gate/up_proj`` on load and split back into them on save, so checkpoint files
keep Hugging Face's names.

The model is first built abstractly (``nnx.eval_shape``, no random init, no
memory) and then filled with the checkpoint's arrays through
``nnx.replace_by_pure_dict`` (the restore pattern of flax's
``examples/gemma``), so a large checkpoint is held once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from safetensors import safe_open
from safetensors.numpy import save_file

from lab import parallel
from lab.hf.config import config_from_hf, config_to_hf, o_bias_expected
from lab.nn import Transformer, TransformerConfig, fuse_qkv, split_qkv

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
IGNORED = re.compile(r".*rotary_emb\.inv_freq$")
_SHARD = re.compile(r"model-\d+-of-\d+\.safetensors")


class Entry(NamedTuple):
    """One checkpoint tensor: its Hugging Face name, its Lab parameter path, whether
    transposed, and which part of a fused Lab parameter it is (``"q"``, ``"k"``,
    ``"v"`` of ``attn.qkv``; ``"gate"``, ``"up"`` of ``mlp.gate_up``; None = the whole)."""

    hf_name: str
    lab_path: tuple
    transpose: bool
    part: str | None = None


def tensor_map(config: TransformerConfig, prefix: str = "model.", root: tuple = ()
               ) -> list[Entry]:
    """Every tensor a checkpoint of ``config`` holds, in Hugging Face's order.

    ``prefix``: the decoder's name prefix (``"model.language_model."`` inside a
    Qwen3-VL checkpoint); ``root``: the Lab path of the Transformer in a larger model
    (``("language_model",)`` in a :class:`lab.nn.VLM`)."""
    out = [Entry(f"{prefix}embed_tokens.weight", (*root, "embed", "embedding"), False)]
    for i in range(config.n_layers):
        hf, lab = f"{prefix}layers.{i}.", (*root, "layers", i)
        for name in ("q", "k", "v"):
            out.append(Entry(f"{hf}self_attn.{name}_proj.weight", (*lab, "attn", "qkv", "kernel"),
                             True, name))
            if config.qkv_bias:
                out.append(Entry(f"{hf}self_attn.{name}_proj.bias", (*lab, "attn", "qkv", "bias"),
                                 False, name))
        out.append(Entry(f"{hf}self_attn.o_proj.weight", (*lab, "attn", "o", "kernel"), True))
        if config.o_bias:  # Qwen3-VL's attention_bias (Lab's plain families have none)
            out.append(Entry(f"{hf}self_attn.o_proj.bias", (*lab, "attn", "o", "bias"), False))
        if config.qk_norm:
            for name in ("q_norm", "k_norm"):
                out.append(Entry(f"{hf}self_attn.{name}.weight", (*lab, "attn", name, "weight"),
                                 False))
        for name in ("gate", "up"):
            out.append(Entry(f"{hf}mlp.{name}_proj.weight", (*lab, "mlp", "gate_up", "kernel"),
                             True, name))
        out.append(Entry(f"{hf}mlp.down_proj.weight", (*lab, "mlp", "down", "kernel"), True))
        out.append(Entry(f"{hf}input_layernorm.weight", (*lab, "attn_norm", "weight"), False))
        out.append(Entry(f"{hf}post_attention_layernorm.weight", (*lab, "mlp_norm", "weight"),
                         False))
    out.append(Entry(f"{prefix}norm.weight", (*root, "norm", "weight"), False))
    if not config.tie_embeddings:
        out.append(Entry("lm_head.weight", (*root, "lm_head", "kernel"), True))
    return out


def _part_shape(config: TransformerConfig, e: Entry) -> tuple:
    """The Lab-side (``[in, out]``) shape of one part of a fused parameter."""
    c = config
    width = {"q": c.n_heads * c.head_dim, "k": c.n_kv_heads * c.head_dim,
             "v": c.n_kv_heads * c.head_dim, "gate": c.d_ff, "up": c.d_ff}[e.part]
    return (width,) if e.lab_path[-1] == "bias" else (c.d_model, width)


def _fuse(config: TransformerConfig, path: tuple, parts: dict) -> np.ndarray:
    """The fused parameter at ``path`` from its parts (see :class:`lab.nn.Attention`)."""
    if path[-2] == "gate_up":
        return np.stack([parts["gate"], parts["up"]], axis=1)
    if path[-1] == "bias":
        q, k, v = (parts[n][None] for n in "qkv")
        return np.asarray(fuse_qkv(q, k, v, config=config))[0]
    return np.asarray(fuse_qkv(parts["q"], parts["k"], parts["v"], config=config))


def _split(config: TransformerConfig, path: tuple, value) -> dict:
    """The parts of the fused parameter ``value`` at ``path`` (inverse of :func:`_fuse`)."""
    value = np.asarray(value)
    if path[-2] == "gate_up":
        return {"gate": value[:, 0], "up": value[:, 1]}
    if path[-1] == "bias":
        return {n: a[0] for n, a in zip("qkv", split_qkv(value[None], config=config),
                                        strict=True)}
    return dict(zip("qkv", (np.asarray(a) for a in split_qkv(value, config=config)),
                    strict=True))


def read_config(path: str) -> dict:
    """The parsed ``config.json`` of a checkpoint directory."""
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path!r} has no config.json; expected a Hugging Face "
                                "checkpoint directory (config.json + model.safetensors)")
    with open(file) as f:
        return json.load(f)


def weight_files(path: str) -> dict[str, str]:
    """Tensor name -> the safetensors file holding it (single file or sharded index)."""
    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no 'weight_map' dict")
        return {name: os.path.join(path, file) for name, file in weight_map.items()}
    single = os.path.join(path, WEIGHTS)
    if os.path.isfile(single):
        with open_safetensors(single) as f:
            return dict.fromkeys(f.keys(), single)
    raise FileNotFoundError(f"{path!r} has neither {WEIGHTS} nor {INDEX}")


def open_safetensors(file: str):
    """``safe_open`` in numpy mode; a missing or corrupt file raises an error naming it."""
    if not os.path.isfile(file):
        raise FileNotFoundError(f"safetensors file {file!r} (named by the checkpoint) is missing")
    try:
        return safe_open(file, framework="np")
    except Exception as e:  # safetensors raises SafetensorError for a bad header
        raise ValueError(f"{file!r} is not a readable safetensors file: {e}") from e


def set_path(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def get_path(tree: dict, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def load_pretrained(path: str | os.PathLike, *, dtype: Any = None, mesh: Mesh | None = None,
                    rules: Sequence[tuple[str, PartitionSpec]] | None = None) -> Transformer:
    """Returns the :class:`lab.nn.Transformer` stored in a Hugging Face checkpoint directory.

    Args:
      path: directory with ``config.json`` and ``model.safetensors`` (or the
        sharded ``model.safetensors.index.json``) of a Qwen3, Qwen2 or Llama model.
      dtype: parameter dtype (``"float32"``, ``"bfloat16"``, ``jnp.bfloat16``, ...);
        ``None`` or ``"auto"`` keeps the checkpoint's ``dtype``/``torch_dtype``.
      mesh: when given, every parameter is placed directly on this
        ``("data", "model")`` mesh by ``rules`` (default
        ``lab.parallel.RULES``), each device receiving only its slice
        (``jax.make_array_from_callback``), so a model larger than one
        device's memory loads; the result is what ``lab.parallel.shard_model``
        would give.

    Raises:
      ValueError: unsupported ``model_type``/RoPE/activation (see
        :func:`lab.hf.config.config_from_hf`), missing tensors (all listed),
        unexpected tensors, a tensor whose shape differs from the one
        ``config.json`` implies (named with both shapes), or a nonzero
        ``o_proj.bias`` (Lab's attention has no output bias).
      FileNotFoundError: no ``config.json`` or no safetensors file.
    """
    path = os.fspath(path)
    hf = read_config(path)
    if str(hf.get("model_type", "")).startswith("qwen3_vl"):
        from lab.hf import qwen3_vl
        if mesh is not None:
            raise ValueError("mesh= is not supported for Qwen3-VL checkpoints; load, then "
                             "place the weights with lab.parallel.shard_model")
        return qwen3_vl.load_pretrained(path, dtype=dtype)
    config = config_from_hf(hf, dtype=dtype)
    files = weight_files(path)
    entries = tensor_map(config)
    expected = {e.hf_name for e in entries}
    missing = [e.hf_name for e in entries if e.hf_name not in files]
    if missing:
        raise ValueError(f"checkpoint {path!r} lacks {len(missing)} tensor(s) that its "
                         f"config.json (model_type={hf['model_type']!r}) implies: "
                         f"{', '.join(missing)}")
    o_bias = {f"model.layers.{i}.self_attn.o_proj.bias" for i in range(config.n_layers)}
    allowed = expected | (o_bias if o_bias_expected(hf) else set())
    if config.tie_embeddings:
        allowed.add("lm_head.weight")  # some writers store the tied head too; it is ignored
    unexpected = sorted(n for n in files if n not in allowed and not IGNORED.match(n))
    if unexpected:
        raise ValueError(f"checkpoint {path!r} has {len(unexpected)} tensor(s) that "
                         f"lab.nn.Transformer has no parameter for: {', '.join(unexpected[:20])}")

    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    values = nnx.to_pure_dict(state)
    with ExitStack() as stack:
        handles = {f: stack.enter_context(open_safetensors(f))
                   for f in sorted(set(files.values()))}
        for name in sorted(o_bias & set(files)):
            bias = handles[files[name]].get_tensor(name)
            if np.any(bias != 0):
                raise ValueError(f"tensor {name!r} is nonzero (max |b| = "
                                 f"{float(np.abs(bias.astype(np.float32)).max()):.3g}); "
                                 "lab.nn.Transformer has no attention output bias")
        fill(values, entries, config, lambda n: handles[files[n]].get_tensor(n), mesh=mesh,
             rules=rules)
    nnx.replace_by_pure_dict(state, values)
    return nnx.merge(graphdef, state)


def fill(values: dict, entries: Sequence[Entry], config: TransformerConfig, tensor, *,
         mesh: Mesh | None = None, rules=None) -> None:
    """Places the checkpoint tensors of ``entries`` (``tensor(name) -> array``) into
    ``values``, a pure dict of a model's state, transposed, fused and cast to
    ``config``'s dtype (on ``mesh`` by ``rules`` when given); raises ValueError for a
    shape that differs from the model's."""
    pending: dict[tuple, dict] = {}
    for e in entries:
        target = get_path(values, e.lab_path)
        shape = _part_shape(config, e) if e.part else tuple(target.shape)
        want = shape[::-1] if e.transpose else shape
        array = tensor(e.hf_name)
        if tuple(array.shape) != want:
            raise ValueError(f"tensor {e.hf_name!r}: expected shape {want} from config.json, "
                             f"found {tuple(array.shape)} in the checkpoint")
        array = np.asarray(array.T if e.transpose else array, dtype=config.jnp_dtype)
        if e.part:  # a part of q/k/v or gate/up: placed once all its parts are read
            parts = pending.setdefault(e.lab_path, {})
            parts[e.part] = array
            if len(parts) < (2 if e.lab_path[-2] == "gate_up" else 3):
                continue
            array = _fuse(config, e.lab_path, pending.pop(e.lab_path))
        if mesh is None:
            set_path(values, e.lab_path, jnp.asarray(array))
            continue
        spec = parallel.spec_for("/".join(map(str, e.lab_path)), array.shape, mesh,
                                 rules or parallel.RULES, head_dim=config.head_dim)
        set_path(values, e.lab_path, jax.make_array_from_callback(
            array.shape, NamedSharding(mesh, spec), lambda index, a=array: a[index]))


def collect(values: dict, entries: Sequence[Entry], config: TransformerConfig
            ) -> dict[str, np.ndarray]:
    """The checkpoint tensors of ``entries`` from ``values`` (the inverse of :func:`fill`)."""
    tensors, split = {}, {}
    for e in entries:
        array = np.asarray(get_path(values, e.lab_path))
        if e.part:
            if e.lab_path not in split:
                split[e.lab_path] = _split(config, e.lab_path, array)
            array = split[e.lab_path][e.part]
        tensors[e.hf_name] = np.ascontiguousarray(array.T if e.transpose else array)
    return tensors


def params_of(model) -> dict:
    """The pure dict of ``model``'s parameters, all addressable from this host (else
    ValueError: save_pretrained writes from one host)."""
    values = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    spread = [x for x in jax.tree.leaves(values) if not x.is_fully_addressable]
    if spread:
        raise ValueError(f"{len(spread)} parameters span several hosts; save_pretrained writes "
                         "from one host: gather them first (jax.experimental.multihost_utils."
                         "process_allgather) or save with orbax")
    return values


def parse_size(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string like ``"200KB"``, ``"5GB"``, ``"1GiB"``."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", str(size), re.IGNORECASE)
    if not m:
        raise ValueError(f"max_shard_size={size!r}; expected bytes as an int or a string like "
                         "'200KB', '5GB'")
    unit = (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}[unit]
    return int(float(m.group(1)) * scale)


def _shards(tensors: dict[str, np.ndarray], limit: int | None) -> list[dict[str, np.ndarray]]:
    """Splits ``tensors`` in order into groups of at most ``limit`` bytes (one tensor minimum)."""
    if limit is None:
        return [tensors]
    groups, current, size = [], {}, 0
    for name, array in tensors.items():
        if current and size + array.nbytes > limit:
            groups.append(current)
            current, size = {}, 0
        current[name] = array
        size += array.nbytes
    groups.append(current)
    return groups


def save_pretrained(model: Transformer, path: str | os.PathLike, *, model_type: str | None = None,
                    max_shard_size: int | str | None = None) -> str:
    """Writes ``model`` as a Hugging Face checkpoint that ``transformers`` loads; returns ``path``.

    Args:
      model: a :class:`lab.nn.Transformer`; parameters are written in their own dtype.
      path: target directory (created; files of an earlier checkpoint there are
        replaced, other files such as a tokenizer are kept).
      model_type: ``"qwen3"``, ``"qwen2"`` or ``"llama"``; default: the family
        that represents the config exactly (:func:`lab.hf.config.default_model_type`).
      max_shard_size: when set, tensors are split into
        ``model-0000k-of-0000n.safetensors`` files of at most this size plus
        ``model.safetensors.index.json``.

    The files are first written to a temporary directory beside ``path`` and
    then moved in one by one with ``os.replace`` (atomic per file), weights
    first and ``config.json`` last, so a reader never sees a half-written file.
    """
    path = os.fspath(path)
    if hasattr(model, "visual"):  # a lab.nn.VLM: Qwen3-VL
        from lab.hf import qwen3_vl
        if model_type not in (None, "qwen3_vl"):
            raise ValueError(f"model_type={model_type!r}; a lab.nn.VLM saves as 'qwen3_vl'")
        return qwen3_vl.save_pretrained(model, path, max_shard_size=max_shard_size)
    config = model.config
    hf = config_to_hf(config, model_type)
    tensors = collect(params_of(model), tensor_map(config), config)
    if o_bias_expected(hf):  # Llama/Qwen3 attention_bias also biases o_proj; Lab's is zero
        dt = tensors["model.norm.weight"].dtype
        for i in range(config.n_layers):
            tensors[f"model.layers.{i}.self_attn.o_proj.bias"] = np.zeros(config.d_model, dt)
    return write_checkpoint(path, tensors, hf, max_shard_size)


def write_checkpoint(path: str, tensors: dict[str, np.ndarray], hf: dict,
                     max_shard_size: int | str | None = None) -> str:
    """Writes ``tensors`` and ``config.json`` = ``hf`` into ``path`` atomically per file
    (see :func:`save_pretrained`); returns ``path``."""
    groups = _shards(tensors, None if max_shard_size is None else parse_size(max_shard_size))
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-hf-")
    try:
        names = [WEIGHTS] if len(groups) == 1 and max_shard_size is None else [
            f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors" for k in range(len(groups))]
        for name, group in zip(names, groups, strict=True):
            save_file(group, os.path.join(tmp, name), metadata={"format": "pt"})
        if max_shard_size is not None:
            index = {"metadata": {"total_size": int(sum(a.nbytes for a in tensors.values()))},
                     "weight_map": {t: n for n, g in zip(names, groups, strict=True) for t in g}}
            with open(os.path.join(tmp, INDEX), "w") as f:
                json.dump(index, f, indent=2)
            names.append(INDEX)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hf, f, indent=2)
        os.makedirs(path, exist_ok=True)
        stale = [f for f in os.listdir(path)
                 if f not in names and (f in (WEIGHTS, INDEX) or _SHARD.fullmatch(f))]
        for name in [*names, "config.json"]:
            os.replace(os.path.join(tmp, name), os.path.join(path, name))
        for name in stale:
            os.remove(os.path.join(path, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
