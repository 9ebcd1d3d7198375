"""HUMOR's perception stage: a tiny :class:`lab.nn.VLM` of the VLM zoo's layout, trained
(pretraining stage, :mod:`lab.zoo.vlm`'s recipe on single 16x16 images of one object) to
name an object's shape and colour, then read out on the meme images as the scene and
intent attributes.

:func:`perceive` asks the shape first (``"What is the object?"`` over the four intents),
then the colour of the shape it saw (``"What colour is the <shape>?"`` over the four
scenes), the zoo's question forms; the two posteriors, concatenated, are the image
features the reward heads read, and their argmax words are the policy's prompt.
"""

from __future__ import annotations

import numpy as np

from lab.methods.humor.data import INTENTS, SCENES

ATTRIBUTES = ("scene", "intent")


def perception_spec(steps: int = 1000, *, colour_steps: int = 300, d_model: int = 32,
                    seed: int = 0, n_eval: int = 128):
    """The :class:`lab.zoo.vlm.VLMSpec` of the perception VLM (cached in the zoo on first
    use, like every zoo VLM), a two-stage curriculum of image_qa on 16x16 images with one
    8-pixel object: ``colour_steps`` of colour questions alone (lr 1e-2, as the zoo's
    ``vlm-test``), then ``steps`` of both question types with dense region targets (lr
    3e-3); ``colour_steps=0`` skips the first stage. Measured while building it (128
    images): the second stage alone (1600 steps) left colour at 0.59 and shape at 0.80;
    the colour questions alone (300 steps) left shape at chance; both stages (300 + 1000)
    gave colour 1.00 and shape 0.67.
    ``n_eval``: held-out image_qa rows of the zoo's own check (the video rows are 16)."""
    from lab.zoo import vlm as zv

    image = {"size": 16, "low_size": 16, "object_size": 8, "distractors": 0,
             "question_types": ("identify", "colour")}
    colour = dict(image, question_types="colour")
    return zv.VLMSpec(
        name="humor-vlm", model=zv.vlm_config(d_model, 1, 1, max_frames=4, size=16),
        stages=(({"image_qa": colour, "steps": int(colour_steps), "batch": 32,
                  "learning_rate": 1e-2, "n_train": 2048, "region_weight": 0.0},)
                if colour_steps else ())
        + ({"image_qa": dict(image), "steps": int(steps), "batch": 32,
            "learning_rate": 3e-3, "n_train": 4096, "region_weight": 1.0},),
        eval={"video_qa": {"frames": 4, "size": 16, "distractors": 0, "object_size": 7,
                           "question_types": ("lookup",), "max_count": 2, "event_len": 1},
              "n_per_type": 16, "image_qa": dict(image), "n_image": int(n_eval)},
        seed=seed, description="HUMOR's perception VLM: shape and colour of one object "
                               "in a 16x16 image")


def load_perception(steps: int = 1000, *, colour_steps: int = 300, d_model: int = 32,
                    seed: int = 0, n_eval: int = 128, source: str | None = None):
    """``(model, tokenizer)`` of :func:`perception_spec`: HUMOR's bundle ``humor-vlm``
    (:func:`lab.zoo.bundle.load`, keyed by the spec's hashed fields), shipped with Lab,
    cached on this host, or trained now by :func:`lab.zoo.vlm.train_vlm` (its held-out
    metrics stored with it)."""
    from flax import nnx

    from lab.nn import VLM
    from lab.zoo import bundle
    from lab.zoo import vlm as zv

    spec = perception_spec(steps, colour_steps=colour_steps, d_model=d_model, seed=seed,
                           n_eval=n_eval)

    def train():
        model, metrics = zv.train_vlm(spec)
        return {"vlm": model}, metrics

    got = bundle.load(spec.name, spec.hashed_fields(), train,
                      lambda: {"vlm": VLM(spec.model, rngs=nnx.Rngs(0))}, source=source)
    return got.modules["vlm"], zv.TOKENIZER


def perceive(model, images: np.ndarray, batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """``(scene_probs [N, 4], intent_probs [N, 4])`` of ``images uint8 [N, 16, 16, 3]``."""
    from lab.zoo import vlm as zv

    imgs = np.asarray(images)
    if imgs.dtype != np.uint8 or imgs.ndim != 4 or imgs.shape[-1] != 3:
        raise ValueError(f"images has shape {imgs.shape} and dtype {imgs.dtype}; expected "
                         "uint8 [N, H, W, 3]")
    v = imgs[:, None]
    n = len(v)
    intent = zv.posteriors(model, v, ["What is the object?"] * n, [list(INTENTS)] * n,
                           batch_size=batch_size)
    qs = [f"What colour is the {INTENTS[int(k)]}?" for k in intent.argmax(-1)]
    scene = zv.posteriors(model, v, qs, [list(SCENES)] * n, batch_size=batch_size)
    return scene, intent


def image_features(scene: np.ndarray, intent: np.ndarray) -> np.ndarray:
    """``float32 [N, 8]`` the reward heads' image features."""
    return np.concatenate([scene, intent], -1).astype(np.float32)


def attribute_accuracy(scene: np.ndarray, intent: np.ndarray, groups: dict) -> dict:
    """Accuracy of the perceived attributes against the groups' true ones."""
    s = float(np.mean(scene.argmax(-1) == groups["scene"]))
    i = float(np.mean(intent.argmax(-1) == groups["intent"]))
    return {"scene": s, "intent": i, "mean": (s + i) / 2}


def blind_attribute_accuracy(train: dict, test: dict) -> dict:
    """The image-blind baseline: each attribute's most frequent training value."""
    s = float(np.mean(test["scene"] == np.bincount(train["scene"]).argmax()))
    i = float(np.mean(test["intent"] == np.bincount(train["intent"]).argmax()))
    return {"scene": s, "intent": i, "mean": (s + i) / 2}
