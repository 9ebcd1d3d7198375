"""S²-Net: spiking-by-synchronisation networks (METHODS.md, ``s2net``).

LIF neurons with surrogate gradients on a connectivity scaffold; oscillator
phases estimated bottom-up from spikes in a finite window; top-down,
time-delayed Kuramoto synchronisation that modulates the neurons' input. The
dynamics are one fused scan (:mod:`kernels_pallas.spiking`).
"""

from lab.methods.s2net.metrics import adjusted_rand_index, binding_ari, circular_kmeans
from lab.methods.s2net.models import (
    ConvEmbed,
    Dynamics,
    KuramotoNet,
    RateRNN,
    S2Net,
    kuramoto_reference,
    n_params,
)
from lab.methods.s2net.scaffold import (
    check_adjacency,
    grid_adjacency,
    grid_offsets,
    random_adjacency,
    ring_adjacency,
)
from lab.methods.s2net.tasks import binding_batch, signal_batch, spike_train_batch
from lab.methods.s2net.training import (
    binding_loss,
    classify_loss,
    evaluate,
    fit,
    pair_phase_loss,
)

__all__ = [
    "ConvEmbed", "Dynamics", "KuramotoNet", "RateRNN", "S2Net", "adjusted_rand_index",
    "binding_ari", "binding_batch", "binding_loss", "check_adjacency", "circular_kmeans",
    "classify_loss", "evaluate", "fit", "grid_adjacency", "grid_offsets", "kuramoto_reference",
    "n_params", "pair_phase_loss", "random_adjacency", "ring_adjacency", "signal_batch",
    "spike_train_batch",
]
