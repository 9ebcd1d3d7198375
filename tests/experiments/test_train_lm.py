"""experiments/train_lm.py: a tiny LM trains end to end, and a rerun resumes from its checkpoint."""

import json
import os

import ml_collections
import pytest

from configs.train_lm import get_config
from experiments import train_lm


def _tiny(steps):
    c = get_config("test")
    c.train.steps = steps
    c.train.checkpoint_every = 3
    c.train.log_every = 1
    c.train.warmup_steps = 0
    c.data.n_train = 64
    c.data.n_eval = 8
    return c


def test_trains_then_resumes_from_the_checkpoint(tmp_path):
    workdir = str(tmp_path)
    first = train_lm.run(_tiny(6), workdir)
    assert first["resumed_from_step"] == 0 and first["steps"] == 6
    for f in ("config.json", "results.json", "report.md", "loss.png"):
        assert os.path.exists(os.path.join(workdir, f))
    assert 0.0 <= first["held_out_answer_accuracy"] <= 1.0
    assert [c["metric"] for c in first["claims"]] == ["final logged loss < first logged loss"]
    with open(os.path.join(workdir, "train", "metrics.jsonl")) as f:
        before = [json.loads(line) for line in f]

    second = train_lm.run(_tiny(9), workdir)
    assert second["resumed_from_step"] == 6 and second["steps"] == 9
    with open(os.path.join(workdir, "train", "metrics.jsonl")) as f:
        after = [json.loads(line) for line in f]
    # The first six steps are the first run's, kept; training went on from step 6.
    assert after[:6] == before and [r["step"] for r in after[6:]] == [7, 8, 9]


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c.__setitem__("epochs", 3), "unknown config keys ['epochs']"),
    (lambda c: c.train.__setitem__("steps", 0), "config.train.steps=0 is invalid"),
    (lambda c: c.model.__setitem__("d_model", "big"), "config.model.d_model='big' has type str"),
    (lambda c: c.__setitem__("init", "lm-nope"), "ZooSpec.init='lm-nope' is unknown"),
    (lambda c: c.__setitem__("init", "lm-xs"), "ZooSpec.init='lm-xs' has another model config"),
])
def test_bad_config_fails_before_training(tmp_path, edit, needle):
    c = ml_collections.ConfigDict(get_config("test").to_dict(), type_safe=False)
    edit(c)
    with pytest.raises(ValueError) as e:
        train_lm.run(c, str(tmp_path / "w"))
    assert needle in str(e.value)
    assert not os.path.exists(tmp_path / "w")


@pytest.mark.parametrize("preset", ["test", "default", "paper"])
def test_preset_describes_its_named_zoo_spec(preset):
    """The launcher trains exactly the named model (same digest, so the same cache entry)."""
    from configs.train_lm import BASE
    from lab.zoo.spec import NAMED

    spec = train_lm.check_config(get_config(preset))
    assert spec.digest() == NAMED[BASE[preset]].digest()
