"""Lab's inference engine: jitted prefill / generate / score on a per-head KV cache.

``prefill`` runs a prompt and applies a cache policy (:mod:`lab.infer.policies`,
kvpress-style eviction per KV head) and can return the statistics it scored;
``generate`` decodes in one jitted ``lax.while_loop`` (greedy, temperature,
top-k, top-p; stop tokens; per-row prompt lengths; optional hidden-state
trajectories; eviction during decoding with ``compress_every``);
``continue_generation`` goes on from a returned cache without re-running the
prompt; ``score`` gives per-token log-probabilities for evaluation; ``complete`` and
``encode_prompts`` (:mod:`lab.infer.text`) go from strings to strings.
"""

from lab.infer import policies
from lab.infer.engine import (
                              Generation,
                              as_batch,
                              continue_generation,
                              generate,
                              generate_memory,
                              memory_analysis,
                              prefill,
                              score,
)
from lab.infer.options import GenerateOptions
from lab.infer.policies import Policy, Stats
from lab.infer.text import complete, encode_prompts
from lab.nn.cache import KVCache

__all__ = ["GenerateOptions", "Generation", "KVCache", "Policy", "Stats", "as_batch",
           "complete", "continue_generation", "encode_prompts", "generate", "generate_memory",
           "memory_analysis", "policies", "prefill", "score"]
