"""Every launcher checks its config the same way (lab.config.check / require) before any work."""

import importlib

import ml_collections
import pytest

from experiments import reproduce
from lab import config as lab_config

LAUNCHERS = sorted([*reproduce.discover(), "train_lm"])


def _modules(name):
    return (importlib.import_module(f"configs.{name}"),
            importlib.import_module(f"experiments.{name}"))


def _loose(c):
    return ml_collections.ConfigDict(c.to_dict(), type_safe=False)


def test_every_experiment_is_covered():
    assert set(LAUNCHERS) >= {"geomem", "gold_panning", "gpa", "hawkeye", "prkv", "s2net",
                              "train_lm"}


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_accepts_its_presets(name):
    cfgs, exp = _modules(name)
    for preset in lab_config.PRESETS:
        c = cfgs.get_config(preset)
        out = exp.check_config(c)
        # train_lm returns the ZooSpec its config describes; the others the config itself
        assert out is c or name == "train_lm"


@pytest.mark.parametrize("name", LAUNCHERS)
@pytest.mark.parametrize("edit, needle", [
    (lambda c: c.__setitem__("preset", "huge"), "preset='huge' is unknown"),
    (lambda c: c.__setitem__("nope", 1), "unknown config keys ['nope']"),
    (lambda c: c.__delitem__("seed") if "seed" in c else c.__delitem__("preset"),
     "config is missing keys"),
])
def test_launcher_rejects_before_any_work(tmp_path, name, edit, needle):
    cfgs, exp = _modules(name)
    c = _loose(cfgs.get_config("test"))
    edit(c)
    with pytest.raises(ValueError) as e:
        exp.run(c, str(tmp_path / "w"))
    assert needle in str(e.value)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("name", LAUNCHERS)
def test_wrong_type_names_key_value_and_type(name):
    cfgs, exp = _modules(name)
    c = _loose(cfgs.get_config("test"))
    key = next(k for k, v in c.items() if isinstance(v, int) and not isinstance(v, bool)
               and k != "preset")
    c[key] = "many"
    with pytest.raises(ValueError, match=f"config.{key}='many' has type str; expected int"):
        exp.check_config(c)


def test_check_and_require_messages():
    def get_config(preset):
        c = ml_collections.ConfigDict()
        c.preset, c.n, c.lo, c.hi = preset, 4, 1, 2
        return c

    c = get_config("test")
    assert lab_config.check(c, get_config, {"n": (lambda v: v > 0, "> 0")}) is c
    c.n = -1
    with pytest.raises(ValueError, match=r"^config.n=-1 is invalid; expected > 0$"):
        lab_config.check(c, get_config, {"n": (lambda v: v > 0, "> 0")})
    with pytest.raises(ValueError,
                       match=r"^config.hi=0 is invalid; expected a number >= lo \(1\)$"):
        lab_config.require(0 >= c.lo, "hi", 0, "a number >= lo (1)")
    lab_config.require(True, "hi", 0, "anything")  # no error when the rule holds
    c.preset = "fast"
    with pytest.raises(ValueError, match="preset='fast' is unknown"):
        lab_config.check(c, get_config)
