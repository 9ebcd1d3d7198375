"""Zoo: a tiny spec trains once and is cached; digests follow the spec; corrupt entries are
detected and retrained or reported; concurrent loads wait for the one writer."""

import math
import os
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from lab import zoo
from lab.data import ByteTokenizer
from lab.zoo import spec as zoo_spec
from lab.zoo.store import entry_lock, flatten_params, write_entry

TINY = zoo.get_spec("lm-test")
WALL = {}  # wall-clock seconds of the fixture's training


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A private LAB_CACHE with lm-test trained once (about 10 CPU-seconds)."""
    root = tmp_path_factory.mktemp("zoo-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_CACHE", str(root))
        before = zoo.TRAININGS[TINY.key]
        t0 = time.perf_counter()
        model, tok = zoo.load_spec(TINY, progress=False)
        WALL["train"] = time.perf_counter() - t0
        assert zoo.TRAININGS[TINY.key] == before + 1
        yield root, model, tok


def test_trains_then_loads_from_cache_without_training(cache):
    root, model, tok = cache
    path = zoo.entry_path(TINY)
    assert path == os.path.join(str(root), "zoo", f"lm-test-{TINY.digest()}")
    assert sorted(os.listdir(path)) == ["manifest.json", "metrics.json", "params.safetensors",
                                        "spec.json"]
    count = zoo.TRAININGS[TINY.key]
    again, tok2 = zoo.load("lm-test")
    assert zoo.TRAININGS[TINY.key] == count  # no second training
    assert isinstance(tok2, ByteTokenizer)
    a, b = flatten_params(model), flatten_params(again)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    x = np.asarray([tok.encode("3+4=?\n", add_bos=True)], np.int32)
    np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(again(x)))


def test_a_fine_tune_starts_from_its_base(cache):
    _, base, _ = cache
    # two updates at learning rate 1e-12: the fine-tune's weights are its base's (a random
    # initialisation would differ by ~init_std = 0.02)
    ft = TINY.replace(name="ft-test", init="lm-test",
                      train=zoo.train_recipe(2, 1e-12, checkpoint_every=0, eval_every=0))
    assert ft.base() is TINY and ft.hashed_fields()["init"] == TINY.key
    assert "init" not in TINY.hashed_fields()          # specs without a base keep their digests
    count = zoo.TRAININGS[TINY.key]
    model, _ = zoo.load_spec(ft, progress=False)
    assert zoo.TRAININGS[TINY.key] == count            # the cached base, not retrained
    a, b = flatten_params(base), flatten_params(model)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(b[k], a[k], atol=1e-8, err_msg=k)
    with pytest.raises(ValueError, match="init='lm-nope' is unknown"):
        ft.replace(init="lm-nope").digest()
    with pytest.raises(ValueError, match="another model config"):
        ft.replace(init="lm-xs").digest()


@pytest.mark.parametrize("name", ["lm-xs", "lm-s"])
def test_named_models_start_from_a_copy_only_stage_of_their_own_architecture(name):
    """The spec wiring behind lm-xs and lm-s's recipe (lab.zoo.spec._copy_stage): each one's
    base is the named copy-only stage, with the same architecture and no base of its own."""
    stage = zoo.get_spec(name).base()
    assert stage is zoo.get_spec(f"{name}-copy") and stage.base() is None
    assert list(stage.data["tasks"]) == ["copy"]
    assert stage.model == zoo.get_spec(name).model


def test_metrics_are_recorded(cache):
    m = zoo.metrics(TINY)
    assert m["final_loss"] < 0.75 * math.log(ByteTokenizer.vocab_size)  # it learned something
    assert m["loss_curve"][0][1] > m["final_loss"]
    for split in ("train", "held_out"):
        acc = m[split]["arithmetic"]
        assert 0 <= acc["exact_match"] <= acc["answer_accuracy"] <= 1
        assert 0 < acc["token_accuracy"] <= 1 and acc["n"] > 0
    # the recorded training time is part of the fixture's wall-clock load (seconds, not ms)
    assert 0.1 * WALL["train"] < m["seconds"]["train"] <= sum(m["seconds"].values()) <= WALL[
        "train"]
    assert m["params"] == TINY.model.num_params()
    # held-out exact match logged during training; its last point is the final model's
    curve = m["held_out_curve"]
    assert [r["step"] for r in curve] == [20, 40]
    assert curve[-1]["eval/arithmetic/exact_match"] == m["held_out"]["arithmetic"]["exact_match"]


def test_digest_follows_what_changes_the_weights(monkeypatch):
    d = TINY.digest()
    assert TINY.replace(train={**TINY.train, "learning_rate": 1e-2}).digest() != d
    assert TINY.replace(batch_size=4).digest() != d
    assert TINY.replace(model=TINY.model.replace(d_model=48, head_dim=24)).digest() != d
    assert TINY.replace(data={**TINY.data, "seed": 1}).digest() != d
    # progress bars, logging and names do not change the weights
    assert TINY.replace(train={**TINY.train, "progress": False, "log_every": 1}).digest() == d
    renamed = TINY.replace(name="other", description="x")
    assert renamed.digest() == d and renamed.key != TINY.key
    assert zoo.ZooSpec.from_dict(TINY.to_dict()) == TINY
    assert TINY.replace(model=TINY.model.replace(qk_smear=2)).digest() != d
    # bumping the format (the generators' output changed) retrains every model
    monkeypatch.setattr(zoo_spec, "ZOO_FORMAT", zoo_spec.ZOO_FORMAT + 1)
    assert TINY.digest() != d


def test_corrupt_entry_is_reported_or_retrained(cache):
    path = zoo.entry_path(TINY)
    params = os.path.join(path, "params.safetensors")
    with open(params, "r+b") as f:  # flip one byte of the weights
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(zoo.CorruptEntry, match="params.safetensors fails its SHA-256"):
        zoo.load_spec(TINY, on_corrupt="raise")
    count = zoo.TRAININGS[TINY.key]
    model, _ = zoo.load_spec(TINY, progress=False)
    assert zoo.TRAININGS[TINY.key] == count + 1  # retrained
    siblings = os.listdir(os.path.dirname(path))
    assert any(s.startswith(os.path.basename(path) + ".corrupt-") for s in siblings)
    os.remove(os.path.join(path, "manifest.json"))  # an interrupted write looks like this
    with pytest.raises(zoo.CorruptEntry, match="has no manifest.json"):
        zoo.load_spec(TINY, on_corrupt="raise")


def test_concurrent_load_waits_for_the_writer(cache, monkeypatch):
    """A load that finds no entry while another writer holds its lock blocks on the lock,
    then uses the writer's entry: it trains nothing. Ordered by events, not by sleeping."""
    _, model, _ = cache
    spec = TINY.replace(name="lm-test-concurrent")
    waiting, acquired, result = threading.Event(), threading.Event(), {}
    real_lock = entry_lock

    @contextmanager
    def observed_lock(key, root=None):
        waiting.set()  # the loader's first read found nothing; it now asks for the lock
        with real_lock(key, root):
            acquired.set()
            yield

    def no_training(*args, **kwargs):
        raise AssertionError("the waiting load trained instead of using the writer's entry")

    monkeypatch.setattr("lab.zoo.store.entry_lock", observed_lock)
    monkeypatch.setattr("lab.zoo.train.train_model", no_training)
    with real_lock(spec.key):  # "another process" is writing this entry
        t = threading.Thread(target=lambda: result.update(out=zoo.load_spec(spec)))
        t.start()
        assert waiting.wait(timeout=60)
        write_entry(spec.key, model, {"spec": spec.to_dict(), "digest": spec.digest()}, {})
        assert not acquired.is_set()  # blocked: the writer still holds the lock
    t.join(timeout=60)
    assert acquired.is_set() and not t.is_alive() and "out" in result
    assert zoo.TRAININGS[spec.key] == 0
    a, b = flatten_params(model), flatten_params(result["out"][0])
    assert all(np.array_equal(a[k], b[k]) for k in a)  # the writer's weights


def test_bad_names_and_specs_are_errors():
    with pytest.raises(ValueError, match="zoo model 'lm-nope' is unknown"):
        zoo.load("lm-nope")
    with pytest.raises(ValueError, match="unknown task 'sudoku'"):
        TINY.replace(data={**TINY.data, "tasks": {"sudoku": {}}})
    with pytest.raises(ValueError, match="seq_len=128 exceeds model.max_len=64"):
        TINY.replace(seq_len=128)
    with pytest.raises(ValueError, match="missing \\['seed'\\]"):
        TINY.replace(data={k: v for k, v in TINY.data.items() if k != "seed"})
    with pytest.raises(ValueError, match="on_corrupt='ignore'"):
        zoo.load_spec(TINY, on_corrupt="ignore")
    assert set(zoo.list()) >= {"lm-xs", "lm-s", "lm-m", "lm-test"}


def test_load_model_takes_a_zoo_name_or_a_checkpoint_directory(cache, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from lab import hf

    model, _ = zoo.load("lm-test")  # the cached entry (earlier tests may have retrained it)
    count = zoo.TRAININGS[TINY.key]
    named, tok = zoo.load_model("lm-test")
    assert zoo.TRAININGS[TINY.key] == count and isinstance(tok, ByteTokenizer)
    x = np.asarray([tok.encode("3+4=?\n", add_bos=True)], np.int32)
    np.testing.assert_array_equal(np.asarray(named(x)), np.asarray(model(x)))

    # a Hugging Face directory: lm-test's weights and a six-word tokenizer
    hf.save_pretrained(model, tmp_path)
    vocab = {"<unk>": 0, "</s>": 1, "3": 2, "+": 3, "4": 4, "=": 5}
    word = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    word.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    loaded, word_tok = zoo.load_model(tmp_path)
    assert word_tok.encode("3 + 4 = 7") == [2, 3, 4, 5, 0] and word_tok.eos_id == 1
    ids = np.asarray([word_tok.encode("3 + 4 =")], np.int32)
    np.testing.assert_allclose(np.asarray(loaded(ids)), np.asarray(model(ids)), atol=1e-6)
    assert zoo.is_checkpoint_dir(tmp_path) and not zoo.is_checkpoint_dir(tmp_path / "nope")


def test_load_model_names_what_it_was_given(tmp_path):
    with pytest.raises(ValueError, match=r"model 'lm-nope' is not a zoo name nor a directory; "
                                         r"expected a zoo model, one of \[.*'lm-xs'.*\]"):
        zoo.load_model("lm-nope")
    with pytest.raises(ValueError, match="is a directory without config.json"):
        zoo.load_model(tmp_path)


def test_spec_from_config_builds_the_launchers_specs():
    import ml_collections

    block = ml_collections.ConfigDict({
        "name": "blk", "d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 64,
        "max_len": 128, "qk_smear": 3, "steps": 30, "learning_rate": 2e-3, "n_train": 100,
        "n_eval": 8, "seq_len": 96, "batch_size": 4})
    tasks = {"copy": {"length": [4, 8]}}
    spec = zoo.spec_from_config(block, tasks, seed=5, warmup_steps=3, checkpoint_every=0,
                                description="d")
    want = zoo.ZooSpec(
        name="blk", model=zoo.byte_lm(32, 1, 2, 1, 64, 128, qk_smear=3),
        train=zoo.train_recipe(30, 2e-3, seed=5, warmup_steps=3, checkpoint_every=0),
        data={"tasks": tasks, "n_train": 100, "n_eval": 8, "seed": 5}, seq_len=96,
        batch_size=4, description="d")
    assert spec == want and spec.key == want.key
    assert spec.train["seed"] == 5 and spec.prompt_weight == 0.0 and spec.init == ""
    block.prompt_weight = 0.25
    assert zoo.spec_from_config(block, tasks, seed=5).prompt_weight == 0.25


def test_launcher_zoo_specs_are_unchanged_by_the_shared_helper():
    """PRKV's and GOLD PANNING's config.zoo blocks give the specs (so the cache keys) that
    each launcher built by hand before ``zoo.spec_from_config``."""
    from configs import gold_panning as gp_configs
    from configs import prkv as prkv_configs
    from experiments import gold_panning, prkv

    c = prkv_configs.get_config("test")
    z = c.zoo
    want = zoo.ZooSpec(
        name=z.name, model=zoo.byte_lm(z.d_model, z.n_layers, z.n_heads, z.n_kv_heads, z.d_ff,
                                       z.max_len, z.qk_smear),
        train=zoo.train_recipe(z.steps, z.learning_rate,
                               warmup_steps=min(50, max(z.steps // 10, 1)), seed=c.seed,
                               checkpoint_every=100),
        data={"tasks": prkv.task_kwargs(c), "n_train": z.n_train, "n_eval": z.n_eval,
              "seed": c.seed},
        seq_len=z.seq_len, batch_size=z.batch_size, prompt_weight=z.prompt_weight)
    assert prkv.zoo_spec(c).key == want.key
    z = gp_configs.get_config("test").zoo_mismatch
    want = zoo.ZooSpec(
        name=z.name, model=zoo.byte_lm(z.d_model, z.n_layers, z.n_heads, z.n_kv_heads, z.d_ff,
                                       z.max_len, z.qk_smear),
        train=zoo.train_recipe(z.steps, z.learning_rate, warmup_steps=max(1, z.steps // 10),
                               seed=z.seed, log_every=50, checkpoint_every=0),
        data={"tasks": {"kv_retrieval": {"weight": 2, "n_docs": list(z.n_docs),
                                         "pairs_per_doc": 1},
                        "copy": {"weight": 1, "length": [8, 32]},
                        "associative_recall": {"weight": 1, "n_pairs": [4, 12],
                                               "n_queries": [1, 3]}},
              "n_train": z.n_train, "n_eval": z.n_eval, "seed": z.seed},
        seq_len=z.seq_len, batch_size=z.batch_size)
    assert gold_panning.zoo_spec(z).key == want.key and z.seed == 1


def test_entries_written_before_fusion_load_with_the_same_logits(cache):
    # Older entries store q/k/v and gate/up separately (layers.i.attn.q.kernel, ...).
    from lab.nn import split_qkv
    from lab.zoo.store import model_from_flat

    _, model, _ = cache
    c = model.config
    flat = flatten_params(model)
    old = {k: v for k, v in flat.items() if ".qkv." not in k and ".gate_up." not in k}
    for i in range(c.n_layers):
        q, k, v = split_qkv(flat[f"layers.{i}.attn.qkv.kernel"], config=c)
        old.update({f"layers.{i}.attn.q.kernel": np.asarray(q),
                    f"layers.{i}.attn.k.kernel": np.asarray(k),
                    f"layers.{i}.attn.v.kernel": np.asarray(v)})
        gu = flat[f"layers.{i}.mlp.gate_up.kernel"]
        old.update({f"layers.{i}.mlp.gate.kernel": gu[:, 0], f"layers.{i}.mlp.up.kernel": gu[:, 1]})
    assert "layers.0.attn.q.kernel" in old and "layers.0.attn.qkv.kernel" not in old
    loaded = model_from_flat(c, old)
    x = np.arange(12, dtype=np.int32)[None] % c.vocab_size
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(model(x)))


def test_bfloat16_training_is_a_zoo_option_with_its_own_key():
    # The zoo trains with TrainConfig's fields, so precision="bfloat16" (float32 master
    # weights) is a recipe override; it changes the weights, so it changes the digest.
    import dataclasses

    from lab.train import TrainConfig

    bf16 = dataclasses.replace(TINY, train={**TINY.train, "precision": "bfloat16"})
    assert TrainConfig.from_dict(bf16.train).precision == "bfloat16"
    assert bf16.digest() != TINY.digest()
    assert zoo_spec.train_recipe(10, 1e-3, precision="bfloat16")["precision"] == "bfloat16"
