"""Geometric memorization (NeurIPS 2026 abstract "How do transformer language models memorize
factual associations?"): random bijections memorised by a one-layer transformer.

* :mod:`~lab.methods.geomem.data`: bijections, multi-hop chains, query tokens,
  chain-of-thought steps, no-memory shortcut baselines.
* :mod:`~lab.methods.geomem.model`: :class:`OneLayer` (embeddings, attention, ReLU MLP).
* :mod:`~lab.methods.geomem.construction`: the closed-form superposition construction
  and its accuracy, as arrays and as :class:`OneLayer` weights.
* :mod:`~lab.methods.geomem.training`: jitted Adam memorisation (:func:`fit`).
* :mod:`~lab.methods.geomem.probes`: superposition R^2, relation gating.
* :mod:`~lab.methods.geomem.capacity`: dimension search, log fits with the slope's
  t-interval and the log-N rule, information counts.
* :mod:`~lab.methods.geomem.sweeps`: the experiment's measurements.
* :mod:`~lab.methods.geomem.report`: tables and plots.
"""

from lab.methods.geomem.capacity import (
    bits_per_coordinate,
    bound_dim,
    log_fit,
    log_rule,
    smallest_dim,
)
from lab.methods.geomem.construction import Construction, construct, cot_accuracy, decode, to_model
from lab.methods.geomem.data import (
    bijections,
    chains,
    compose,
    cot_steps,
    queries,
    shortcut_baselines,
)
from lab.methods.geomem.model import PAD, OneLayer, accuracy, capture, predict
from lab.methods.geomem.probes import gating_selectivity, superposition_r2
from lab.methods.geomem.training import FitConfig, fit

__all__ = [
    "PAD", "Construction", "FitConfig", "OneLayer", "accuracy", "bijections",
    "bits_per_coordinate", "bound_dim", "capture", "chains", "compose", "construct",
    "cot_accuracy", "cot_steps", "decode", "fit", "gating_selectivity", "log_fit", "log_rule",
    "predict", "queries", "shortcut_baselines", "smallest_dim", "superposition_r2", "to_model",
]
