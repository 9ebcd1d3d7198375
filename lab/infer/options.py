"""The options of a generation, grouped: how to sample, and how to evict.

:class:`GenerateOptions` is what a user may pass as ``options=`` to
:func:`lab.infer.generate`; :class:`Eviction` is the engine's validated plan of
the cache policy. Both are frozen (hashable), so a jitted program takes them as
static arguments.
"""

from __future__ import annotations

import dataclasses

from lab.infer import policies as policies_lib

GENERATE_CAPTURES = ("hidden", "last_hidden")


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """How :func:`lab.infer.generate` samples.

    max_new_tokens: tokens generated per row (>= 1).
    temperature:    0 = greedy; otherwise softmax sampling at this temperature,
                    restricted to ``top_k`` tokens and/or the ``top_p`` nucleus
                    (Hugging Face's logits warpers).
    stop_tokens:    ids that end a row (kept in the output); the row then emits
                    ``pad_id`` and its cache stops changing.
    seed:           the sampling key (one key per step, shared by the rows).
    capture:        ``("hidden",)`` every layer's residual stream per step,
                    ``("last_hidden",)`` the last block's only.
    pad_id:         the id written after a row stops (and used to pad prompts).
    """

    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    stop_tokens: tuple[int, ...] = ()
    seed: int = 0
    capture: tuple[str, ...] = ()
    pad_id: int = 0

    def __post_init__(self):
        n = self.max_new_tokens
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"max_new_tokens={n!r}; expected an int >= 1")
        object.__setattr__(self, "stop_tokens", tuple(int(s) for s in self.stop_tokens))
        capture = (self.capture,) if isinstance(self.capture, str) else tuple(self.capture)
        if len(capture) > 1 or any(c not in GENERATE_CAPTURES for c in capture):
            raise ValueError(f"capture={capture!r}; expected () or one of {GENERATE_CAPTURES}")
        object.__setattr__(self, "capture", capture)
        if not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r}; expected an int")
        if self.top_p is not None:
            object.__setattr__(self, "top_p", float(self.top_p))

    @property
    def greedy(self) -> bool:
        return float(self.temperature) == 0.0

    def static(self) -> GenerateOptions:
        """These options with the run-time values (temperature, seed) neutral: the part
        that shapes the compiled program."""
        return dataclasses.replace(self, temperature=0.0 if self.greedy else 1.0, seed=0)


@dataclasses.dataclass(frozen=True)
class Eviction:
    """The engine's validated cache plan (static in the compiled program).

    policy:         the :class:`~lab.infer.policies.Policy`, or None to keep everything.
    kwargs:         the policy's keyword arguments, sorted ``(name, value)`` pairs.
    window:         prompt queries captured for policies that need ``"queries"``.
    capacity:       cache slots per KV head.
    compress_every: during decoding, re-apply the policy every this many new
                    tokens, scoring with their queries (None = only after the prompt).
    """

    policy: policies_lib.Policy | None
    kwargs: tuple = ()
    window: int = 64
    capacity: int = 0
    compress_every: int | None = None

    @property
    def needs(self) -> tuple[str, ...]:
        return self.policy.needs if self.policy is not None else ()
