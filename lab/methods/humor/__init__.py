"""HUMOR ("hierarchical multi-path chain-of-thought and group-wise preference RL for meme
captioning"): synthetic meme data with a hidden preference, the perception VLM, the
hierarchical multi-path generation grammar with CoT traced back from ground-truth captions,
pairwise (Bradley-Terry, within template groups) and pointwise reward models, and the
reward-model reward for group-wise RL on ``lab.train.rl``.

- :mod:`lab.methods.humor.data`: templates, captions, the hidden preference, noisy
  in-group pairwise labels, win rates;
- :mod:`lab.methods.humor.perception`: the perception VLM (a zoo-layout
  :class:`lab.nn.VLM`) and its scene / intent read-out, the image features;
- :mod:`lab.methods.humor.reward_model`: the NNX reward heads, the BT loss, pair accuracy;
- :mod:`lab.methods.humor.generation`: the grammar, CoT tracing, SFT, sampling, path
  diversity and the ``humor_rm`` reward;
- :mod:`lab.methods.humor.shortcuts`: image-blind shortcut reward models.
"""

from lab.methods.humor.data import (
    INTENTS,
    MAX_SCORE,
    SCENES,
    SUBJECTS,
    TONES,
    TWISTS,
    best_caption,
    caption_words,
    hidden_score,
    incongruity,
    make_caption,
    meme_groups,
    noisy_best,
    parse_caption,
    random_caption,
    template_name,
    templates,
    win_rates,
)
from lab.methods.humor.generation import (
    MODES,
    completion_caption,
    format_cot,
    parse_cot,
    path_diversity,
    perceived_words,
    prompt,
    register_rm_reward,
    sft_examples,
    trace_cot,
    train_sft,
)
from lab.methods.humor.perception import (
    attribute_accuracy,
    blind_attribute_accuracy,
    image_features,
    load_perception,
    perceive,
    perception_spec,
)
from lab.methods.humor.reward_model import (
    KINDS,
    RewardHead,
    bt_loss,
    held_out_pair_accuracy,
    pair_accuracy,
    score_captions,
    train_reward_model,
)
from lab.methods.humor.shortcuts import SHORTCUTS, caption_win_rates, shortcut_accuracy

__all__ = [
    "INTENTS", "KINDS", "MAX_SCORE", "MODES", "SCENES", "SHORTCUTS", "SUBJECTS", "TONES",
    "TWISTS", "RewardHead", "attribute_accuracy", "best_caption", "blind_attribute_accuracy",
    "bt_loss", "caption_win_rates", "caption_words", "completion_caption",
    "format_cot", "held_out_pair_accuracy", "hidden_score", "image_features",
    "incongruity", "load_perception", "make_caption", "meme_groups", "noisy_best",
    "pair_accuracy", "parse_caption", "parse_cot", "path_diversity", "perceive",
    "perceived_words", "perception_spec", "prompt", "random_caption", "register_rm_reward",
    "score_captions", "shortcut_accuracy", "sft_examples", "template_name", "templates",
    "trace_cot", "train_reward_model", "train_sft", "win_rates",
]
