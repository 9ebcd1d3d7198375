"""CoT trajectory geometry: a chain of thought's hidden states as a curve in R^d.

Following "the geometry of chain-of-thought trajectories" (NeurIPS 2026 submission: each
reasoning chain a discrete curve in the hidden-state space, characterised by spectral,
positional and kinematic functionals; the effective dimension ``d_rho`` as a measure of
trajectory complexity, larger for harder problems; early kinematic features as a
correctness predictor).

- :mod:`~lab.methods.cot_geometry.functionals`: :func:`spectrum`,
  :func:`effective_dimension`, :func:`participation_ratio`, :func:`kinematics`,
  :func:`features`, :func:`windowed_effective_dimension`, :func:`prefix_mask`;
  batched and jitted over right-padded trajectories with masks.
- :mod:`~lab.methods.cot_geometry.trajectories`: :func:`trajectories`, chains generated
  with :mod:`lab.infer` and their hidden states at chosen layers.
- :mod:`~lab.methods.cot_geometry.predictor`: :func:`fit_logistic` /
  :func:`predict_logistic` (JAX + optax) and the exact :func:`auc` (Mann-Whitney).
"""

from lab.methods.cot_geometry.functionals import (
    RHO_TOL,
    SCALAR_FEATURES,
    VECTOR_FEATURES,
    check_rho,
    effective_dimension,
    feature_matrix,
    features,
    kinematics,
    participation_ratio,
    prefix_mask,
    spectrum,
    windowed_effective_dimension,
)
from lab.methods.cot_geometry.predictor import (
    Logistic,
    auc,
    auc_entry,
    auc_se,
    fit_logistic,
    midranks,
    predict_logistic,
)
from lab.methods.cot_geometry.trajectories import Trajectories, resolve_layers, trajectories

__all__ = [
    "RHO_TOL", "SCALAR_FEATURES", "VECTOR_FEATURES", "Logistic", "Trajectories", "auc",
    "auc_entry", "auc_se", "check_rho", "effective_dimension", "feature_matrix", "features",
    "fit_logistic", "kinematics", "midranks", "participation_ratio", "predict_logistic",
    "prefix_mask", "resolve_layers", "spectrum", "trajectories",
    "windowed_effective_dimension",
]
