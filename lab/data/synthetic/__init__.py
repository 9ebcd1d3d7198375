"""Synthetic task generators with known ground truth and difficulty (``datasets.Dataset``)."""

from lab.data.synthetic.arithmetic import arithmetic, evaluate_chain
from lab.data.synthetic.base import ANSWER_PREFIX, COMMON_COLUMNS, FILLER_SENTENCES, extract_answer
from lab.data.synthetic.copy import copy
from lab.data.synthetic.icl import icl_classification
from lab.data.synthetic.kv_retrieval import kv_retrieval, render_kv_prompt
from lab.data.synthetic.long_context import needle, variable_tracking
from lab.data.synthetic.mixture import GENERATORS, generate, mixture
from lab.data.synthetic.recall import associative_recall

__all__ = [
    "ANSWER_PREFIX", "COMMON_COLUMNS", "FILLER_SENTENCES", "GENERATORS", "arithmetic",
    "associative_recall", "copy", "evaluate_chain", "extract_answer", "generate",
    "icl_classification", "kv_retrieval",
    "mixture", "needle", "render_kv_prompt", "variable_tracking",
]
