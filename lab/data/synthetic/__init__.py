"""Synthetic task generators with known ground truth and difficulty (``datasets.Dataset``)."""

from lab.data.synthetic.arithmetic import arithmetic, evaluate_chain
from lab.data.synthetic.base import ANSWER_PREFIX, COMMON_COLUMNS, FILLER_SENTENCES, extract_answer
from lab.data.synthetic.copy import copy
from lab.data.synthetic.icl import icl_classification
from lab.data.synthetic.image import IMAGE_QUESTION_TYPES, downsample, image_qa, render_images
from lab.data.synthetic.kv_retrieval import kv_retrieval, render_kv_prompt
from lab.data.synthetic.long_context import needle, variable_tracking
from lab.data.synthetic.mixture import GENERATORS, generate, mixture
from lab.data.synthetic.recall import associative_recall
from lab.data.synthetic.render import check_images
from lab.data.synthetic.tempocausal import TEMPOCAUSAL_TYPES, tempocausal
from lab.data.synthetic.video import (
    QUESTION_TYPES,
    oracle_answer,
    render_video,
    render_videos,
    video_qa,
)

__all__ = [
    "ANSWER_PREFIX", "COMMON_COLUMNS", "FILLER_SENTENCES", "GENERATORS", "arithmetic",
    "associative_recall", "copy", "evaluate_chain", "extract_answer", "generate",
    "icl_classification", "kv_retrieval",
    "mixture", "needle", "render_kv_prompt", "variable_tracking",
    "IMAGE_QUESTION_TYPES", "QUESTION_TYPES", "check_images", "downsample", "image_qa",
    "oracle_answer", "render_images", "render_video", "render_videos", "video_qa",
    "TEMPOCAUSAL_TYPES", "tempocausal",
]
