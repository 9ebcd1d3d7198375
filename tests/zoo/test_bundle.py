"""Bundles of a method's own trained modules (lab.zoo.bundle): trained once then read back bit
for bit, keyed by their recipe, shipped copies preferred, corrupt entries moved aside and
retrained, and every load recorded in zoo.loads()."""

import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab import zoo
from lab.zoo import bundle


class Scaled(nnx.Module):
    """A parameter and a non-parameter variable, as GPA's oracles hold."""

    def __init__(self, width: int, *, rngs: nnx.Rngs):
        self.dense = nnx.Linear(3, width, rngs=rngs)
        self.scale = nnx.Variable(jnp.ones(()))


RECIPE = {"width": 4, "steps": 3}


def _fns(width=4):
    def train():
        m = Scaled(width, rngs=nnx.Rngs(7))
        m.scale.set_value(jnp.asarray(2.5))
        return {"net": m, "other": Scaled(width, rngs=nnx.Rngs(8))}, {"seconds": {"fit": 0.1}}

    def template():
        return {"net": Scaled(width, rngs=nnx.Rngs(0)), "other": Scaled(width, rngs=nnx.Rngs(0))}

    return train, template


@pytest.fixture
def roots(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(bundle, "SHIPPED_ASSETS", str(tmp_path / "assets"))
    monkeypatch.delenv(zoo.SOURCE_ENV, raising=False)
    monkeypatch.setattr(bundle, "TRAININGS", {})
    return tmp_path


def _arrays(modules):
    return bundle.flatten(modules)


def test_trained_once_then_read_back_bit_for_bit(roots):
    train, template = _fns()
    first = bundle.load("toy", RECIPE, train, template)
    assert first.source == "trained" and first.key == bundle.key("toy", RECIPE)
    assert first.metrics["seconds"] == {"fit": 0.1} and first.metrics["train_seconds"] >= 0
    assert bundle.TRAININGS[first.key] == 1
    second = bundle.load("toy", RECIPE, train, template)
    assert second.source == "trained"  # this process trained it
    bundle.TRAININGS.clear()            # a new process: read from the cache
    third = bundle.load("toy", RECIPE, train, template)
    assert third.source == "cached" and bundle.TRAININGS == {}
    a, b = _arrays(first.modules), _arrays(third.modules)
    assert sorted(a) == sorted(b) and "net/scale" in a
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert float(third.modules["net"].scale.get_value()) == 2.5
    row = zoo.loads()[-1]
    assert row["key"] == first.key and row["source"] == "cached" and row["trained_on"]


def test_a_changed_recipe_is_another_key_and_trains(roots):
    train, template = _fns()
    a = bundle.load("toy", RECIPE, train, template)
    b = bundle.load("toy", {**RECIPE, "steps": 4}, train, template)
    assert a.key != b.key and b.source == "trained" and bundle.TRAININGS[b.key] == 1


def test_corrupt_cache_entry_is_moved_aside_and_retrained(roots):
    train, template = _fns()
    k = bundle.load("toy", RECIPE, train, template).key
    bundle.TRAININGS.clear()
    path = os.path.join(bundle.cache_dir(), k, "params.safetensors")
    with open(path, "r+b") as f:
        f.seek(-2, os.SEEK_END)
        f.write(b"\x00\x01")
    got = bundle.load("toy", RECIPE, train, template)
    assert got.source == "trained" and bundle.TRAININGS[k] == 1
    assert any(".corrupt-" in d for d in os.listdir(bundle.cache_dir()))
    # a template whose shapes differ from the stored arrays is refused the same way
    bundle.TRAININGS.clear()
    _, wide = _fns(width=5)
    got = bundle.load("toy", RECIPE, train, wide)
    assert got.source == "trained"


def test_shipped_copy_is_preferred_and_a_stale_one_reported(roots):
    train, template = _fns()
    k = bundle.load("toy", RECIPE, train, template).key
    assert bundle.ship(k)["status"] == "shipped"
    assert bundle.ship(k)["status"] == "unchanged"
    bundle.TRAININGS.clear()
    got = bundle.load("toy", RECIPE, train, template)
    assert got.source == "shipped" and bundle.TRAININGS == {}
    assert zoo.loads()[-1]["path"] == os.path.join(bundle.shipped_root(), k)
    # the recipe changed and the shipped copy was not refreshed
    new = {**RECIPE, "steps": 9}
    got = bundle.load("toy", new, train, template)
    assert got.source == "trained"
    assert f"the shipped toy is {k}, trained by another recipe" in zoo.loads()[-1]["notes"][0]
    with pytest.raises(ValueError, match="source='shipped' but Lab ships no usable bundle"):
        bundle.load("toy", {**RECIPE, "steps": 10}, train, template, source="shipped")
    # shipping the new key replaces the old one
    bundle.ship(bundle.key("toy", new))
    assert os.listdir(bundle.shipped_root()) == [bundle.key("toy", new)]


def test_train_source_retrains_even_when_cached(roots, monkeypatch):
    train, template = _fns()
    k = bundle.load("toy", RECIPE, train, template).key
    bundle.TRAININGS.clear()
    monkeypatch.setenv(zoo.SOURCE_ENV, "train")
    assert bundle.load("toy", RECIPE, train, template).source == "trained"
    assert bundle.TRAININGS[k] == 1


def test_bad_recipe_name_and_missing_entry_are_named(roots):
    train, template = _fns()
    with pytest.raises(ValueError, match="recipe=.*is not JSON-serialisable"):
        bundle.load("toy", {"f": object()}, train, template)
    with pytest.raises(ValueError, match="name='a/b'"):
        bundle.load("a/b", RECIPE, train, template)
    with pytest.raises(ValueError, match="bundle 'toy-000000000000': no cache entry"):
        bundle.ship("toy-000000000000")


def test_a_module_holding_rngs_is_refused(roots):
    class Noisy(nnx.Module):
        def __init__(self):
            self.dense = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
            self.rngs = nnx.Rngs(1)

    with pytest.raises(ValueError, match="bundle module 'n' holds random-number state"):
        bundle.load("noisy", RECIPE, lambda: ({"n": Noisy()}, {}), lambda: {"n": Noisy()})
