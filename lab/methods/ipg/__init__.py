"""IPG: Integrated Policy Gradient attribution of outcome rewards to model components
("Integrated Policy Gradient", NeurIPS 2026), its answer-logit baselines and a task with a
planted mechanism whose truth is known.

- :mod:`lab.methods.ipg.components`: the component types, MLP neurons and
  sparse-autoencoder features on the residual stream;
- :mod:`lab.methods.ipg.attribution`: integration rules, the policy-gradient estimator,
  IPG, ablation / amplification outcomes, precision@k;
- :mod:`lab.methods.ipg.baselines`: activation magnitude, gradient x activation and
  integrated gradients on the answer logit, attribution patching;
- :mod:`lab.methods.ipg.plant`: the chain task and the planted-model training.
"""

from lab.methods.ipg.attribution import (
    METHODS,
    Attribution,
    check_components,
    check_rewards,
    component_mask,
    integrated_policy_gradient,
    integration_points,
    outcome,
    policy_gradient,
    precision_at_k,
    rank_correlation,
    sample,
    set_scale,
    top_components,
)
from lab.methods.ipg.baselines import (
    activation_magnitude,
    activations,
    answer_logit_grad,
    answer_logits,
    attribution_patching,
    gradient_x_activation,
    integrated_gradients,
)
from lab.methods.ipg.components import Neurons, SAEFeatures, residual_stream
from lab.methods.ipg.plant import ChainTask, PlantConfig, planted_neurons, train_planted

__all__ = [
    "METHODS", "Attribution", "ChainTask", "Neurons", "PlantConfig", "SAEFeatures",
    "activation_magnitude", "activations", "answer_logit_grad", "answer_logits",
    "attribution_patching", "check_components",
    "check_rewards", "component_mask", "gradient_x_activation", "integrated_gradients",
    "integrated_policy_gradient", "integration_points", "outcome", "planted_neurons",
    "policy_gradient", "precision_at_k", "rank_correlation", "residual_stream", "sample",
    "set_scale", "top_components",
    "train_planted",
]
