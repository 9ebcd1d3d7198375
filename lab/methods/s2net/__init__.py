"""S²-Net: spiking-by-synchronisation networks (the S²-Net abstract, NeurIPS 2026).

LIF neurons with surrogate gradients on a connectivity scaffold; oscillator
phases estimated bottom-up from spikes in a finite window; top-down,
time-delayed Kuramoto synchronisation that modulates the neurons' input. The
dynamics are one fused scan (:mod:`kernels_pallas.spiking`).

Our reading of the abstract (the paper's equations are not public to us):

* bottom-up: neuron ``j``'s phase is the angle of its spike-triggered phasor
  over the last ``window`` steps against a global rhythm of ``period`` steps;
* top-down: each neuron carries an oscillator phase ``psi_i`` that a delayed
  Kuramoto term pulls towards its neighbours' spike phases (neighbours
  communicate only through spikes); ``psi_i`` multiplies the neuron's input by
  ``1 + gain * cos(rhythm + psi_i)``, which sets when it fires;
* trainable: the Kuramoto couplings (per grid offset or per edge, or one
  strength), the synaptic weights, the gain, the frequency offset, encoder and
  readout. Binding is trained on the spike phases plus the oscillator phases
  (``binding_loss(oscillator_weight=...)``): with the spike phases alone the
  surrogate gradient through spike timing did not train the couplings (ARI
  0.07-0.5 after 150 steps against 0.9 with the oscillator term).
"""

from lab.methods.s2net import shortcuts
from lab.methods.s2net.metrics import adjusted_rand_index, binding_ari, circular_kmeans
from lab.methods.s2net.models import (
    ConvEmbed,
    ConvRNN,
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
from lab.methods.s2net.tasks import (
    binding_batch,
    bound_query_batch,
    flicker_batch,
    signal_batch,
    spike_train_batch,
)
from lab.methods.s2net.training import (
    binding_loss,
    classify_loss,
    evaluate,
    fit,
    pair_phase_loss,
)

__all__ = [
    "ConvEmbed", "ConvRNN", "Dynamics", "KuramotoNet", "RateRNN", "S2Net",
    "adjusted_rand_index", "binding_ari", "binding_batch", "binding_loss", "bound_query_batch",
    "check_adjacency", "circular_kmeans", "classify_loss", "evaluate", "fit", "flicker_batch",
    "grid_adjacency", "grid_offsets", "kuramoto_reference", "n_params", "pair_phase_loss",
    "random_adjacency", "ring_adjacency", "shortcuts", "signal_batch", "spike_train_batch",
]
