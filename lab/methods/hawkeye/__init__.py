"""Hawkeye: hardware-aware kernel optimisation grounded in a taxonomy of strategies.

The taxonomy (ten strategies, one unit test per target architecture) lives in
:mod:`kernels_pallas.taxonomy`; this package holds the search that stacks the
strategies for a workload:

- :mod:`.search`: :func:`search` (propose, unit-test, check against XLA, time,
  keep the best) and :class:`SearchResult`.
- :mod:`.proposers`: systematic strategy stacking, evolutionary search, and the
  :class:`Proposer` protocol through which a coding agent plugs in.
- :mod:`.cost`: :class:`MeasuredCost` (wall time on the device) and
  :class:`RooflineCost` (an analytic model for hosts without the target GPU).
"""

from kernels_pallas.taxonomy.workloads import Workload
from lab.methods.hawkeye.cost import MeasuredCost, RooflineCost
from lab.methods.hawkeye.proposers import (
    AgentProposer,
    Context,
    DefaultProposer,
    EvolutionaryProposer,
    Proposer,
    SystematicProposer,
)
from lab.methods.hawkeye.search import (
    Evaluation,
    SearchResult,
    relevant_strategies,
    search,
    target_tests,
    validate_target,
)

__all__ = ["AgentProposer", "Context", "DefaultProposer", "Evaluation", "EvolutionaryProposer",
           "MeasuredCost", "Proposer", "RooflineCost", "SearchResult", "SystematicProposer",
           "Workload", "relevant_strategies", "search", "target_tests", "validate_target"]
