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
    IMAGE_QUESTION_TYPES,
    QUESTION_TYPES,
    arithmetic,
    associative_recall,
    check_images,
    copy,
    downsample,
    extract_answer,
    generate,
    icl_classification,
    image_qa,
    kv_retrieval,
    mixture,
    needle,
    oracle_answer,
    render_images,
    render_kv_prompt,
    render_video,
    render_videos,
    variable_tracking,
    video_qa,
)
from lab.data.tokenizer import ByteTokenizer, HFTokenizer, tokenizer_from_dict
from lab.data.video_records import load_frames, load_longvideobench, load_videomme, uniform_indices

__all__ = [
    "ANSWER_PREFIX", "GENERATORS", "ByteTokenizer", "HFTokenizer", "answers_match", "arithmetic",
    "associative_recall", "copy",
    "encode_example", "encode_sft", "extract_answer", "generate", "icl_classification",
    "kv_retrieval", "last_boxed", "load_math500_jsonl", "mixture", "needle", "normalize_answer",
    "packed_sft_batches",
    "render_kv_prompt", "sft_batches", "step_indices", "tokenizer_from_dict", "variable_tracking",
    "IMAGE_QUESTION_TYPES", "QUESTION_TYPES", "check_images", "downsample", "image_qa",
    "oracle_answer", "render_images", "render_video", "render_videos", "video_qa",
    "load_frames", "load_longvideobench", "load_videomme", "uniform_indices",
]
