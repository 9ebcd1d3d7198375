"""Agent-REINFORCE: searching compute-optimal multi-LLM collaboration graphs for test-time
scaling (the Agent-REINFORCE abstract).

- :mod:`~lab.methods.agent_reinforce.graph`: :class:`CollaborationGraph` (roles, model
  assignments, a DAG) and the fixed topologies (best-of-N, self-refine, debate);
- :mod:`~lab.methods.agent_reinforce.executor`: :class:`ModelPool`, :class:`Executor` (runs a
  graph on a batch: accuracy, analytic FLOPs, measured latency; cached node calls);
- :mod:`~lab.methods.agent_reinforce.distribution`: :class:`GraphDistribution` (categoricals
  over width, depth, roles and models; Bernoulli edges);
- :mod:`~lab.methods.agent_reinforce.search`: the objective and budget, the
  sample -> feedback -> update loop with a :class:`FeedbackAgent` (:class:`RuleBasedAnalyst`,
  :class:`LLMAnalyst`), and the baselines (random search, plain REINFORCE).
"""

from lab.methods.agent_reinforce.distribution import LAYER_ROLES, Choices, GraphDistribution
from lab.methods.agent_reinforce.executor import (
    Chains,
    Executor,
    ModelPool,
    NodeOutcome,
    Problems,
    Result,
    least_confident_step,
    step_spans,
    vote,
)
from lab.methods.agent_reinforce.graph import (
    ROLES,
    CollaborationGraph,
    Node,
    best_of_n,
    debate,
    layered,
    self_refine,
)
from lab.methods.agent_reinforce.search import (
    METHODS,
    Evaluation,
    Feedback,
    FeedbackAgent,
    FeedbackItem,
    LLMAnalyst,
    Objective,
    RuleBasedAnalyst,
    Trace,
    check_budget,
    hypervolume,
    pareto_front,
    parse_feedback,
    search,
)

__all__ = ["LAYER_ROLES", "METHODS", "ROLES", "Chains", "Choices", "CollaborationGraph",
           "Evaluation", "Executor", "Feedback", "FeedbackAgent", "FeedbackItem",
           "GraphDistribution", "LLMAnalyst", "ModelPool", "Node", "NodeOutcome", "Objective",
           "Problems", "Result", "RuleBasedAnalyst", "Trace", "best_of_n", "check_budget",
           "debate", "hypervolume", "layered", "least_confident_step", "pareto_front",
           "parse_feedback", "search", "self_refine", "step_spans", "vote"]
