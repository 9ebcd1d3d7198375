"""The zoo's shipped weights: the files match their manifests and their recipes, each model
re-measures its recorded check accuracy, every default-preset model ships, and a changed
recipe or a corrupt file falls back to the cache or to training with a message."""

import importlib
import json
import os
import shutil

import numpy as np
import pytest

from experiments.reproduce import discover
from lab import zoo
from lab.data import ByteTokenizer
from lab.zoo import bundle, ship, store, vlm
from lab.zoo.store import MANIFEST_FILE, METRICS_FILE, SPEC_FILE, entry_keys, flatten_params
from lab.zoo.train import held_out_pool

ALL_SHIPPED = entry_keys(store.SHIPPED_DIR)
SHIPPED = [k for k in ALL_SHIPPED if k.rsplit("-", 1)[0] not in vlm.NAMED]     # language models
SHIPPED_VLM = [k for k in ALL_SHIPPED if k.rsplit("-", 1)[0] in vlm.NAMED]
TINY = zoo.get_spec("lm-test")
CHECK_TOLERANCE = 1  # examples per task (of ship.CHECK_PER_TASK) that float rounding may flip


def _json(path):
    with open(path) as f:
        return json.load(f)


def default_models() -> set[str]:
    """Zoo names that the registered experiments' ``default`` configs load (``model*``)."""
    names = set()
    for exp in discover():
        config = importlib.import_module(f"configs.{exp}").get_config("default")
        for field, value in config.items():
            if field.startswith("model") and isinstance(value, str) and value in zoo.NAMED:
                names.add(value)
    return names


def test_every_model_of_the_default_preset_ships_within_40_mb():
    shipped = {key.rsplit("-", 1)[0] for key in SHIPPED}
    assert default_models() >= {"lm-xs-long", "lm-xs-docs", "lm-xs-early"}
    assert default_models() <= shipped
    roots = [(store.SHIPPED_DIR, ALL_SHIPPED),
             (bundle.SHIPPED_ASSETS, entry_keys(bundle.SHIPPED_ASSETS))]  # methods' bundles
    total = sum(os.path.getsize(os.path.join(root, k, f))
                for root, keys in roots for k in keys for f in os.listdir(os.path.join(root, k)))
    assert total < 40e6, f"shipped weights take {total / 1e6:.1f} MB"


@pytest.mark.parametrize("key", ALL_SHIPPED)
def test_shipped_files_match_their_manifest_and_their_current_recipe(key):
    path = os.path.join(store.SHIPPED_DIR, key)
    manifest = _json(os.path.join(path, MANIFEST_FILE))
    assert sorted(manifest) == sorted(set(os.listdir(path)) - {MANIFEST_FILE})
    for fname, digest in manifest.items():
        assert store._sha256(os.path.join(path, fname)) == digest, f"{key}/{fname}"
    name = key.rsplit("-", 1)[0]
    assert name in zoo.NAMED or name in vlm.NAMED, f"{key} ships a model the zoo no longer names"
    spec = zoo.get_spec(name)
    # fails loudly when a recipe changed and its weights were not re-shipped
    assert spec.key == key, (f"{name}'s recipe is now {spec.key}, but {key} ships: "
                             f"retrain and run python -m lab.zoo.ship {name}")
    assert _json(os.path.join(path, SPEC_FILE))["digest"] == spec.digest()


@pytest.mark.parametrize("key", SHIPPED)
def test_each_shipped_model_meets_its_recorded_check_accuracy(key):
    name = key.rsplit("-", 1)[0]
    spec = zoo.get_spec(name)
    model, _ = zoo.load(name, source="shipped")
    assert zoo.loads()[-1]["source"] == "shipped"
    recorded = _json(os.path.join(store.SHIPPED_DIR, key, METRICS_FILE))["shipped"]["check"]
    rows = held_out_pool(spec).select(recorded["pool_indices"])
    measured = zoo.evaluate(model, rows, ByteTokenizer(), spec.seq_len)
    for task, em in recorded["exact_match"].items():
        if task == "all":
            continue
        n = measured[task]["n"]
        assert n == recorded["per_task"]
        assert abs(measured[task]["exact_match"] - em) * n <= CHECK_TOLERANCE, (task, em)
        assert abs(measured[task]["token_accuracy"] - recorded["token_accuracy"][task]) < 0.02


@pytest.mark.parametrize("key", SHIPPED_VLM)
def test_each_shipped_vlm_makes_its_recorded_choices(key):
    # the same options on the check set (float32 as trained; another host's rounding may
    # flip a close call, CHECK_TOLERANCE per question type)
    name = key.rsplit("-", 1)[0]
    spec = vlm.NAMED[name]
    model, _ = zoo.load(name, source="shipped")
    assert zoo.loads()[-1]["source"] == "shipped"
    recorded = _json(os.path.join(store.SHIPPED_DIR, key, METRICS_FILE))["shipped"]["check"]
    assert recorded["videos"] == ship.vlm_check(spec)["videos"]
    got = ship.vlm_choices(model, spec, recorded)
    videos, _ = vlm.held_out(spec)
    types = np.asarray(videos.select(recorded["videos"])["question_type"])
    flips = np.asarray(got["videos"]) != np.asarray(recorded["choices"]["videos"])
    for t in set(types.tolist()):
        assert flips[types == t].sum() <= CHECK_TOLERANCE, t
    assert sum(a != b for a, b in zip(got["images"], recorded["choices"]["images"],
                                      strict=True)) <= CHECK_TOLERANCE


def test_ship_vlm_writes_a_loadable_entry_with_its_check(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(store, "SHIPPED_DIR", str(tmp_path / "weights"))
    monkeypatch.delenv(zoo.SOURCE_ENV, raising=False)
    with pytest.raises(ValueError, match="vlm-test: no cache entry"):
        ship.ship_vlm("vlm-test")
    trained, _ = zoo.load("vlm-test", source="cache", progress=False)
    result = ship.ship_vlm("vlm-test")
    assert result["status"] == "shipped" and result["dtype"] == "float32"
    assert ship.ship_vlm("vlm-test")["status"] == "unchanged"
    model, _ = zoo.load("vlm-test")
    assert zoo.loads()[-1]["source"] == "shipped"
    a, b = flatten_params(model), flatten_params(trained)
    assert all(np.array_equal(a[k], b[k]) for k in a)     # float32, as trained
    check = zoo.metrics("vlm-test")["shipped"]["check"]
    assert check["choices"] == ship.vlm_choices(model, vlm.NAMED["vlm-test"], check)
    with pytest.raises(ValueError, match="VLM zoo model 'vlm-q' is unknown"):
        ship.ship_vlm("vlm-q")


def test_compact_dtype_rule_counts_examples_per_task():
    ref = {"a": {"exact_match": 0.5, "n": 64}, "all": {"exact_match": 0.5, "n": 64}}
    assert ship.within({"a": {"exact_match": 0.5 + 2 / 64}}, ref)
    assert not ship.within({"a": {"exact_match": 0.5 - 3 / 64}}, ref)


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """A private cache with lm-test trained once (about 10 CPU-seconds)."""
    root = tmp_path_factory.mktemp("shipped-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_CACHE", str(root))
        mp.delenv(zoo.SOURCE_ENV, raising=False)
        zoo.load_spec(TINY, source="cache", progress=False)
        yield root


@pytest.fixture
def tiny_shipped(tiny_cache, tmp_path, monkeypatch):
    """lm-test shipped from the private cache into a private weights directory."""
    monkeypatch.setenv("LAB_CACHE", str(tiny_cache))
    monkeypatch.setattr(store, "SHIPPED_DIR", str(tmp_path / "weights"))
    monkeypatch.delenv(zoo.SOURCE_ENV, raising=False)
    return tmp_path / "weights", ship.ship("lm-test")


def test_ship_then_load_prefers_shipped_weights_and_a_rerun_changes_no_file(tiny_shipped):
    weights, result = tiny_shipped
    assert result["status"] == "shipped" and result["dtype"] in ("float16", "float32")
    params = weights / TINY.key / "params.safetensors"
    before = (params.stat().st_mtime_ns, store._sha256(str(params)))
    assert ship.ship("lm-test")["status"] == "unchanged"
    assert (params.stat().st_mtime_ns, store._sha256(str(params))) == before
    assert zoo.list()["lm-test"]["source"] == "shipped"
    assert zoo.list(source="cache")["lm-test"]["source"] == "cached"
    count = zoo.TRAININGS[TINY.key]
    model, _ = zoo.load("lm-test")
    assert zoo.TRAININGS[TINY.key] == count
    record = zoo.loads()[-1]
    assert record["source"] == "shipped" and record["stored_dtype"] == result["dtype"]
    assert record["trained_on"] and record["train_seconds"] > 0
    assert "shipped" in zoo.metrics("lm-test")
    cached, _ = zoo.load("lm-test", source="cache")  # "trained" once this process trained it
    assert zoo.loads()[-1]["source"] == ("trained" if zoo.TRAININGS[TINY.key] else "cached")
    a, b = flatten_params(model), flatten_params(cached)
    tol = 1e-3 if result["dtype"] == "float16" else 0.0  # rounding to float16 only
    assert all(np.allclose(a[k], b[k], rtol=tol, atol=tol) for k in a)


def test_train_source_retrains_once_per_process(tiny_shipped, monkeypatch):
    monkeypatch.setitem(zoo.TRAININGS, TINY.key, 0)  # a new process: shipped and cached exist
    count = 0
    monkeypatch.setenv(zoo.SOURCE_ENV, "train")
    assert zoo.list()["lm-test"]["source"] == "train"
    zoo.load("lm-test", progress=False)
    assert zoo.TRAININGS[TINY.key] == count + 1 and zoo.loads()[-1]["source"] == "trained"
    zoo.load("lm-test", progress=False)  # a second load of the same run reads its result
    assert zoo.TRAININGS[TINY.key] == count + 1 and zoo.loads()[-1]["source"] == "trained"
    monkeypatch.setenv(zoo.SOURCE_ENV, "newest")
    with pytest.raises(ValueError, match="LAB_ZOO='newest'; expected one of"):
        zoo.load("lm-test")


def test_a_changed_recipe_or_a_corrupt_shipped_file_falls_back_with_a_message(tiny_shipped):
    weights, _ = tiny_shipped
    entry = weights / TINY.key
    with open(entry / "params.safetensors", "r+b") as f:  # flip one byte of the weights
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    zoo.load("lm-test")
    record = zoo.loads()[-1]
    assert record["source"] in ("cached", "trained") and record["path"] == zoo.entry_path(TINY)
    assert "cannot be trusted" in record["notes"][0] and "SHA-256" in record["notes"][0]
    assert entry.exists()  # shipped files are never moved aside
    with pytest.raises(ValueError, match="source='shipped' but Lab ships no usable entry"):
        zoo.load("lm-test", source="shipped")
    # a recipe change: the shipped entry has another key than the spec's
    entry.rename(weights / "lm-test-000000000000")
    count = zoo.TRAININGS[TINY.key]
    zoo.load("lm-test")
    record = zoo.loads()[-1]
    assert record["path"] == zoo.entry_path(TINY) and zoo.TRAININGS[TINY.key] == count
    assert "lm-test-000000000000, trained by another recipe" in record["notes"][0]
    assert "python -m lab.zoo.ship lm-test" in record["notes"][0]
    shutil.rmtree(zoo.entry_path(TINY))  # and without a cache entry: trained, with the message
    zoo.load("lm-test", progress=False)
    record = zoo.loads()[-1]
    assert record["source"] == "trained" and zoo.TRAININGS[TINY.key] == count + 1
    assert "trained by another recipe" in record["notes"][0]
