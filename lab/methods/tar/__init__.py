"""TAR: traffic anomaly reasoning dataset tooling.

The TAR release (NVIDIA, "Traffic Anomaly Reasoning", the AI City Challenge 2026
Track 3 data, ``nvidia/PhysicalAI-Traffic-Anomaly-Reasoning``, CC-BY-4.0): multi-task
annotations with chain-of-thought reasoning traces over CCTV traffic videos, in three
task groups (Question Answering, Temporal Reasoning, Scene Understanding).

* :mod:`~lab.methods.tar.schema`: the annotation schema (train task files, the test
  split with ``item_index``, the submission CSV, frames from image folders);
* :mod:`~lab.methods.tar.metrics`: one evaluator per task type;
  :mod:`~lab.methods.tar.bertscore`: BERTScore F1 from a local BERT directory;
* :mod:`~lab.methods.tar.synthetic`: a top-down traffic video generator with anomalies
  and a frame tracker; :mod:`~lab.methods.tar.labels`: the auto-labeller;
  :mod:`~lab.methods.tar.dataset`: synthetic splits on disk;
* :mod:`~lab.methods.tar.harness`: ``predict`` / ``evaluate``;
  :mod:`~lab.methods.tar.shortcuts`: shortcut baselines and the tracker upper bound;
* :mod:`~lab.methods.tar.vlm`: a small VLM (:class:`lab.nn.VLM`) pretrained on dense
  perception targets and fine-tuned on the annotations, as a harness predictor (imported
  on its own: it needs JAX, the rest of the tooling does not).
"""

from lab.methods.tar import labels, metrics, shortcuts, synthetic
from lab.methods.tar.bertscore import BERTScorer
from lab.methods.tar.dataset import build_splits, make_videos, write_split
from lab.methods.tar.harness import PredictFn, evaluate, predict
from lab.methods.tar.schema import (
    TASK_GROUPS,
    TASK_METRIC,
    TASKS,
    Item,
    SchemaError,
    load_frames,
    load_task,
    load_test,
    load_train,
    read_submission,
    resolve_media_root,
    write_submission,
)

__all__ = [
    "BERTScorer", "Item", "PredictFn", "SchemaError", "TASKS", "TASK_GROUPS", "TASK_METRIC",
    "build_splits", "evaluate", "labels", "load_frames", "load_task", "load_test", "load_train",
    "make_videos", "metrics", "predict", "read_submission", "resolve_media_root", "shortcuts",
    "synthetic",
    "write_split", "write_submission",
]
