"""TCR-Agent and TCR-Former: temporal causal reasoning over event narratives (the NeurIPS
2026 TempoCausal paper: "from discrete narratives to causal topologies").

- :mod:`lab.methods.tcr.agent`: TCR-Agent, a parser of the narrative into a causal graph
  with time spans and a symbolic intervention engine (do(), counterfactual truncation);
  "unparsed" when the story is outside its grammar;
- :mod:`lab.methods.tcr.former`: TCR-Former, :class:`lab.nn.Transformer` with a
  causal-topological layout and attention mask and learned temporal-span biases, given
  through the attention's ``mask=`` / ``bias=`` (XLA or the Pallas kernel);
- :mod:`lab.methods.tcr.training`: training and evaluation of TCR-Former and of the
  same-size plain and CoT Transformers.

The benchmark is :func:`lab.data.synthetic.tempocausal`.
"""

from lab.methods.tcr.agent import (
    UNPARSED,
    CausalGraph,
    ParseError,
    answer,
    answer_graph,
    do,
    parse,
    parse_question,
    truncated,
)
from lab.methods.tcr.former import SpanBias, TCRFormer, WordVocab, encode, structure
from lab.methods.tcr.training import fit, predict, predict_cot

__all__ = [
    "UNPARSED", "CausalGraph", "ParseError", "SpanBias", "TCRFormer", "WordVocab", "answer",
    "answer_graph", "do", "encode", "fit", "parse", "parse_question", "predict", "predict_cot",
    "structure", "truncated",
]
