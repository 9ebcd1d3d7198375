"""IPG: integrated policy gradient attribution on a model with a planted mechanism.

Run:
  python -m experiments.ipg --config=configs/ipg.py:default --workdir=/tmp/ipg

A small Transformer is trained (inside the run) on left-to-right modular chain sums so
that a known set of MLP neurons gates the chain's first step, several tokens before the
answer (lab.methods.ipg.plant), once per seed of ``seeds``. Every attribution method
ranks all MLP neurons; the report gives precision@k against the planted set and the
accuracy after ablating / amplifying each method's top-k, as means over the seeds, which
the claims read. With ``sae.enabled`` the methods also rank the features of a sparse
autoencoder on the planted layer's residual stream, against each feature's measured
effect (every feature ablated alone). Presets: ``test`` (seconds, the tests), ``default``
(five seeds, a few minutes on a two-core CPU), ``paper`` (more samples and integration
steps).
"""

from __future__ import annotations

import ml_collections

from lab.config import check_preset


def get_config(preset: str | None = "default") -> ml_collections.ConfigDict:
    preset = check_preset(preset)
    c = ml_collections.ConfigDict()
    c.preset = preset
    c.seeds = (0, 1, 2, 3, 4)  # each trains its own planted model on its own data
    c.task = ml_collections.ConfigDict(dict(n_operands=4, modulus=5))
    # the planted model (lab.methods.ipg.PlantConfig)
    c.plant = ml_collections.ConfigDict(dict(
        d_model=48, n_layers=2, n_heads=4, d_ff=64, plant_layer=0, n_planted=6,
        p_planted=0.3, p_random=0.4, steps=1200, batch=64, learning_rate=3e-3))
    c.n_eval = 512             # held-out prompts for accuracies (greedy)
    c.n_random_sets = 5        # random neuron sets ablated for the plant check
    c.ipg = ml_collections.ConfigDict(dict(
        n_prompts=256, samples=2, steps=8, method="gausslegendre", baseline=0.0,
        temperature=1.0))
    c.riemann_method = "riemann_trapezoid"  # IPG again with this rule at the same steps
    c.ig_steps = 8             # integrated gradients on the answer logit
    c.n_attr = 512             # prompts the answer-logit baselines read
    # (n_eval = n_attr = ipg.n_prompts * ipg.samples: one compiled generation per mode)
    c.amplify = 2.0            # factor of the amplification of a method's top-k
    # the second component type: features of a sparse autoencoder (lab.nn.fit_sae) on the
    # residual stream after the planted layer, trained on the model's own chains
    c.sae = ml_collections.ConfigDict(dict(
        enabled=True, n_features=128, l1=3e-2, steps=2000, batch=256, learning_rate=1e-3,
        n_prompts=1024))
    if preset == "test":
        c.seeds = (0, 1)
        c.plant.update(steps=20, batch=16, d_model=16, n_layers=1, d_ff=16, n_planted=3)
        c.n_eval = 16
        c.n_random_sets = 2
        c.ipg.update(n_prompts=16, samples=1, steps=2)
        c.ig_steps = 2
        c.n_attr = 16
        c.sae.update(n_features=8, steps=20, batch=32, n_prompts=16)
    elif preset == "paper":
        c.plant.update(steps=3000, batch=128, d_ff=256, n_planted=16)
        c.n_eval = 4096
        c.ipg.update(n_prompts=1024, samples=4, steps=16)
        c.ig_steps = 32
        c.n_attr = 4096
        c.sae.update(n_features=512, steps=4000, n_prompts=4096)
    return c
