"""Lab's inference engine: jitted prefill / generate / score on a per-head KV cache.

``prefill`` runs a prompt and applies a cache policy (:mod:`lab.infer.policies`,
kvpress-style eviction per KV head); ``generate`` decodes in one jitted
``lax.while_loop`` (greedy, temperature, top-k, top-p; stop tokens; per-row
prompt lengths; optional hidden-state trajectories); ``score`` gives per-token
log-probabilities for evaluation.
"""

from lab.infer import kvpress, policies  # noqa: F401 (kvpress registers its policies)
from lab.infer.engine import Generation, as_batch, generate, generate_memory, prefill, score
from lab.infer.policies import Policy, Stats
from lab.nn.cache import KVCache

__all__ = ["Generation", "KVCache", "Policy", "Stats", "as_batch", "generate", "generate_memory",
           "policies", "prefill", "score"]
