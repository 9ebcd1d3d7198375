"""GeoSym: a synthetic geometry engine with exact symbolic ground truth.

A type-conditional grammar of constructions (:mod:`.grammar`, its rules in
:mod:`.rules`, the :class:`Construction` in :mod:`.construction`) over exact
and float coordinates (:mod:`.geometry`); SymGT, the exact solver with a float
cross-check and per-problem time limits (:mod:`.solver`); a matplotlib
renderer (:mod:`.render`, called as ``geosym.render.render(construction)``);
question templates, answer-verified chains of thought and the exact-match
verifier / RL reward (:mod:`.questions`); records, stratified splits, a curated
bench split and the ``datasets`` / TFDS builders (:mod:`.dataset`).
"""

from lab.methods.geosym import geometry, render
from lab.methods.geosym.dataset import (
    GenConfig,
    GenStats,
    build_tfds,
    curate_bench,
    generate,
    make_problem,
    split,
    strata_counts,
    to_hf,
    to_sft,
)
from lab.methods.geosym.grammar import (
    ALL_RULES,
    BASE_RULES,
    RULES,
    Construction,
    DegenerateError,
    Inapplicable,
    SampleStats,
    build,
    sample,
)
from lab.methods.geosym.questions import (
    QUESTION_TYPES,
    STRATA,
    Question,
    candidates,
    chain_of_thought,
    extract_answer,
    make_question,
    parse,
    reward,
    stratum,
    verify,
)
from lab.methods.geosym.solver import (
    Inexact,
    Solution,
    SolverTimeout,
    Unsuitable,
    solve,
    time_limit,
)

__all__ = [
    "ALL_RULES", "BASE_RULES", "QUESTION_TYPES", "RULES", "STRATA", "Construction",
    "DegenerateError", "GenConfig", "GenStats", "Inapplicable", "Inexact", "Question",
    "SampleStats", "Solution", "SolverTimeout", "build", "build_tfds",
    "candidates", "chain_of_thought", "curate_bench", "extract_answer", "generate",
    "geometry", "make_problem", "make_question", "parse", "render", "reward",
    "sample",
    "solve", "split", "strata_counts", "stratum", "time_limit", "to_hf", "to_sft", "Unsuitable",
    "verify",
]
