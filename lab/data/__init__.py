"""Lab's data layer: tokenizers, synthetic task generators, real-format loaders, SFT batches.

``lab.data`` imports no other Lab module (docs/design.md, "Layers").
"""

from lab.data.batching import (
    encode_example,
    encode_sft,
    packed_sft_batches,
    sft_batches,
    step_indices,
)
from lab.data.math500 import answers_match, last_boxed, load_math500_jsonl, normalize_answer
from lab.data.synthetic import (
    ANSWER_PREFIX,
    GENERATORS,
    arithmetic,
    associative_recall,
    copy,
    extract_answer,
    generate,
    icl_classification,
    kv_retrieval,
    mixture,
    needle,
    render_kv_prompt,
    variable_tracking,
)
from lab.data.tokenizer import ByteTokenizer, HFTokenizer, tokenizer_from_dict

__all__ = [
    "ANSWER_PREFIX", "GENERATORS", "ByteTokenizer", "HFTokenizer", "answers_match", "arithmetic",
    "associative_recall", "copy",
    "encode_example", "encode_sft", "extract_answer", "generate", "icl_classification",
    "kv_retrieval", "last_boxed", "load_math500_jsonl", "mixture", "needle", "normalize_answer",
    "packed_sft_batches",
    "render_kv_prompt", "sft_batches", "step_indices", "tokenizer_from_dict", "variable_tracking",
]
