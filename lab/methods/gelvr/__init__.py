"""GeLVR / GePO: geometry-consistent latent visual reasoning (the GeLVR abstract, NeurIPS 2026).

What this package holds:

* :mod:`~lab.methods.gelvr.vmf`: the von Mises-Fisher distribution (log-density through
  a scaled Bessel function, Wood's rejection sampler), agreeing with
  ``scipy.stats.vonmises_fisher``;
* :mod:`~lab.methods.gelvr.policy`: GePO's hybrid categorical + vMF policy (and the
  Gaussian-policy baseline): per-step log-probabilities and sampling;
* :mod:`~lab.methods.gelvr.losses`: GeLVR's Gram-matrix alignment loss of latent slots
  with target visual features, the per-slot alignment it is compared with, and GePO's
  objective (the shared policy-gradient loss of :mod:`lab.train` plus the
  geometry-preserving regulariser) as a Trainer ``loss_fn``;
* :mod:`~lab.methods.gelvr.latent`: reasoning steps between a zoo VLM's image and its
  answer (latent slots fed back from the decoder's state, a text chain, or none), GePO's
  rollouts and the zoomed-target geometry features;
* :mod:`~lab.methods.gelvr.training`: GeLVR's SFT and GePO's RL with their baselines, on
  :func:`lab.data.image_qa` at two resolutions (``experiments/gelvr.py`` runs the table).
"""

from lab.methods.gelvr import latent, training
from lab.methods.gelvr.losses import (
    GePOLoss,
    cosine_gram,
    gather_slots,
    gepo_loss,
    gram_alignment_loss,
    pool_slots,
    pooling_matrix,
    slot_alignment_loss,
)
from lab.methods.gelvr.policy import (
    FAMILIES,
    HybridPolicyOutput,
    categorical_log_prob,
    gaussian_log_prob,
    hybrid_log_prob,
    hybrid_sample,
    latent_log_prob,
    mean_direction,
    trajectory_log_prob,
)
from lab.methods.gelvr.vmf import (
    log_ive,
    log_normalizer,
    mean_resultant_length,
    vmf_log_prob,
    vmf_sample,
)

__all__ = [
    "FAMILIES", "GePOLoss", "HybridPolicyOutput", "categorical_log_prob", "cosine_gram",
    "gather_slots", "gaussian_log_prob", "gepo_loss", "gram_alignment_loss", "hybrid_log_prob",
    "hybrid_sample", "latent_log_prob", "log_ive", "log_normalizer", "mean_direction",
    "mean_resultant_length", "pool_slots", "pooling_matrix", "slot_alignment_loss",
    "trajectory_log_prob", "vmf_log_prob", "vmf_sample", "latent", "training",
]
