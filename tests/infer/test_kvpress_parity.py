"""Every kvpress-rule policy keeps the same entries as NVIDIA's kvpress on one checkpoint.

A tiny random Qwen3 (GQA 4/2, q/k norm) is built by ``transformers``, saved, and
loaded by ``lab.hf.load_pretrained``. For each press, kvpress's own ``score``
runs on the torch model's prefill (keys after RoPE, the eager attention
probabilities, the layer's hidden states and rotary embeddings, as kvpress's
forward hook hands them over) and its kept set is ``scores.topk(n_kept)`` with
kvpress's ``compute_n_kept``, per (layer, KV head); Lab's is the positions left in
the cache ``lab.infer.prefill(policy=..., ratio=...)`` returns.

kvpress 0.5.5 pins ``transformers<5.3``; its presses' scoring runs unchanged on
the newer transformers Lab tests against, but its forward hook reads the cache
under the older keyword (``past_key_values``), so this test calls each press's
``score`` from a hook of its own. Install it without its pins:
``pip install --no-deps kvpress==0.5.5`` (the README's test command does).

Random scores (``RandomPress``) use torch's generator and cannot match; the
random policy is tested for its budget in ``test_kvpress.py``. Budgets are kept
above SnapKV's 64-token window: below it kvpress keeps an arbitrary subset of
the (tied) window entries.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
kvpress = pytest.importorskip(
    "kvpress", reason="kvpress is not installed: pip install --no-deps kvpress==0.5.5")

from kvpress.utils import compute_n_kept  # noqa: E402

from lab import hf, infer  # noqa: E402

T = 192
RATIOS = (0.25, 0.6)                 # budgets 144, 76: both above the 64-token window
# A kept-set difference is allowed only between entries whose kvpress scores tie the
# budget's boundary score to float32 rounding (torch and XLA sum in different orders).
TIE_RTOL = 1e-5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cfg = transformers.Qwen3Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        max_position_embeddings=512, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, tie_word_embeddings=True, rope_theta=1e6, bos_token_id=None,
        eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if name.endswith("norm.weight")
                    else 0.15 * torch.randn_like(p))
    path = str(tmp_path_factory.mktemp("qwen3"))
    model.save_pretrained(path, safe_serialization=True)
    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, size=(1, T))
    return model, hf.load_pretrained(path), tokens


def kvpress_scores(model, press, tokens) -> list[np.ndarray]:
    """kvpress's scores ``[Hkv, T]`` per layer for the prompt ``tokens`` ``[1, T]``."""
    scores = []

    def hook(module, args, kwargs, output):
        layer = kwargs["cache"].layers[module.layer_idx]
        s = press.score(module, kwargs["hidden_states"], layer.keys, layer.values, output[1],
                        kwargs)
        scores.append(s[0].float().numpy())

    handles = [layer.self_attn.register_forward_hook(hook, with_kwargs=True)
               for layer in model.model.layers]
    try:
        with torch.no_grad():
            model(torch.tensor(tokens), cache=transformers.DynamicCache(
                config=model.config), use_cache=True)
    finally:
        for h in handles:
            h.remove()
    return scores


def lab_kept(model, policy, ratio, tokens, **kwargs) -> np.ndarray:
    """Kept positions ``[L, Hkv, n]`` (sorted) of Lab's compressed prefill cache."""
    # One buffer size for every ratio: one compiled prefill per policy.
    _, cache = infer.prefill(model, jnp.asarray(tokens), policy=policy, ratio=ratio,
                             capacity=T, **kwargs)
    pos = np.asarray(cache.positions)[:, 0]                      # [L, Hkv, C]
    n = int((pos[0, 0] >= 0).sum())
    return np.sort(np.where(pos >= 0, pos, T + 1), axis=-1)[..., :n]


PRESSES = {
    "knorm": (lambda r: kvpress.KnormPress(r), {}),
    "streaming_llm": (lambda r: kvpress.StreamingLLMPress(r, n_sink=4), {}),
    "tova": (lambda r: kvpress.TOVAPress(r), {}),
    "snapkv": (lambda r: kvpress.SnapKVPress(r, window_size=64, kernel_size=5), {"window": 64}),
    # Lab's H2O adds a recent window; with none it is ObservedAttentionPress.
    "h2o": (lambda r: kvpress.ObservedAttentionPress(r), {"recent_fraction": 0.0}),
}


@pytest.mark.parametrize("policy", list(PRESSES))
def test_kept_set_equals_kvpress(models, policy):
    hf_model, lab_model, tokens = models
    make, kwargs = PRESSES[policy]
    for ratio in RATIOS:
        n_kept = compute_n_kept(T, ratio)
        got = lab_kept(lab_model, policy, ratio, tokens, **kwargs)
        assert got.shape[-1] == n_kept, (policy, ratio)
        for layer, scores in enumerate(kvpress_scores(hf_model, make(ratio), tokens)):
            for head, s in enumerate(scores):
                want = set(np.argsort(-s, kind="stable")[:n_kept].tolist())
                diff = want ^ set(got[layer, head].tolist())
                boundary = np.sort(s)[::-1][n_kept - 1]
                ties = all(abs(s[j] - boundary) <= TIE_RTOL * abs(boundary) for j in diff)
                assert ties, (policy, ratio, layer, head, sorted(diff))
