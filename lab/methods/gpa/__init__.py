"""GPA: generative population annealing for regulatory DNA design.

Annealed sequential Monte Carlo over DNA sequences: particles start from a
frozen generator (an autoregressive Transformer or a masked discrete-diffusion
Transformer, both trained by Lab on :mod:`lab.data.dna`), are tilted toward a
frozen CNN oracle's prediction by adaptive tempering, resampled when their ESS
falls, and moved by the generator itself with a Metropolis-Hastings correction.

Modules: :mod:`.smc` (ESS, resampling, tempering), :mod:`.generators`,
:mod:`.oracle`, :mod:`.sampler` (GPA), :mod:`.baselines`, :mod:`.design`
(assets, objectives, moves, metrics).
"""

from lab.methods.gpa.sampler import GPAConfig, Population, gpa
from lab.methods.gpa.smc import SCHEMES, ess, next_temperature, resample

__all__ = ["GPAConfig", "Population", "SCHEMES", "ess", "gpa", "next_temperature", "resample"]
