"""experiments/prkv.py at the test preset: the zoo path end to end, the Hugging Face path on a
tiny random Qwen3 checkpoint written here, and config validation."""

import json

import numpy as np
import pytest
from flax import nnx
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from configs.prkv import get_config
from experiments import prkv as exp
from lab.hf import save_pretrained
from lab.nn import Transformer, TransformerConfig


def check_outputs(out, workdir, config):
    files = {p.name for p in workdir.iterdir()}
    assert {"config.json", "results.json", "report.md", "accuracy_vs_ratio.png"} <= files
    saved = json.loads((workdir / "results.json").read_text())
    for task in config.tasks.names:
        for p in config.eval.policies:
            for r in config.eval.ratios:
                a = saved["accuracy"][task][p][str(float(r))]
                assert 0.0 <= a <= 1.0
        # KV bytes measured from the compressed caches: 0.75 keeps int(T / 4) tokens
        # (a fifth of a 10-token arithmetic prompt, just under a quarter of ~100 tokens).
        kb = saved["costs"][task]["policies"]["prkv"]["kept_bytes"]
        assert (0.2 if task == "arithmetic" else 0.23) <= kb["0.75"] / kb["0.0"] <= 0.25
        assert saved["costs"][task]["policies"]["prkv"]["score_fraction"] > 0
    # Compiled generate memory: StreamingLLM (no statistics) at 0.75 needs less than the full
    # cache; PRKV is measured at every ratio.
    mem = saved["memory"]
    assert set(mem) == set(config.eval.policies)
    assert mem["streaming_llm"]["0.75"] < mem["full"]["0.0"]
    assert set(mem["prkv"]) == {str(float(r)) for r in config.eval.ratios}
    assert all(isinstance(c["holds"], bool) for c in out["claims"]) and len(out["claims"]) >= 3
    assert "### variable_tracking" in (workdir / "report.md").read_text()
    # The ablation: every (alpha, kernel) pair at the non-zero ratios; the main configuration's
    # row is the main table's.
    ab = saved["ablation"]
    a = config.ablation
    assert ab["task"] == a.task and ab["full"] == saved["accuracy"][a.task]["full"]["0.0"]
    question = exp.ablation_name(config.prkv.alpha, config.prkv.kernel_size, "question")
    assert a.question_restart and set(ab["variants"]) == {
        exp.ablation_name(al, k) for al in a.alphas for k in a.kernel_sizes} | {question}
    assert all(0 <= v <= 1 for v in ab["variants"][question].values())
    assert ab["variants"][ab["main"]] == {k: v for k, v in
                                          saved["accuracy"][a.task]["prkv"].items() if k != "0.0"}
    assert any("multi-hop PageRank" in c["claim"] for c in out["claims"])
    assert "PRKV ablation" in (workdir / "report.md").read_text()


def test_zoo_path_end_to_end(tmp_path):
    config = get_config("test")
    out = exp.run(config, str(tmp_path))
    check_outputs(out, tmp_path, config)
    assert out["model"]["source"].startswith("prkv-test-")


def test_hf_path_on_a_tiny_random_qwen3(tmp_path):
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["The grass is green. abc=417. Number of kqzt? A: 12"] * 10, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "bos_token": "<|endoftext|>"}, open(tmp_path / "tokenizer_config.json", "w"))
    cfg = TransformerConfig(vocab_size=tok.get_vocab_size(), d_model=32, n_layers=1, n_heads=2,
                            n_kv_heads=1, head_dim=16, d_ff=64, max_len=256, qk_norm=True)
    save_pretrained(Transformer(cfg, rngs=nnx.Rngs(0)), tmp_path, model_type="qwen3")
    config = get_config("test")
    config.model = str(tmp_path)
    work = tmp_path / "out"
    out = exp.run(config, str(work))
    check_outputs(out, work, config)
    assert out["model"]["source"] == str(tmp_path)


def test_config_validation_names_the_key():
    config = get_config("test")
    config.eval.ratios = [0.0, 1.0]
    with pytest.raises(ValueError, match=r"eval.ratios=\[0.0, 1.0\].*\[0, 1\)"):
        exp.check_config(config)
    config = get_config("test")
    config.eval.policies = ["full", "snap"]
    with pytest.raises(ValueError, match="eval.policies"):
        exp.check_config(config)
    config = get_config("test")
    config.prkv.graph = "layer"
    with pytest.raises(ValueError, match="prkv.graph='layer'"):
        exp.check_config(config)
    assert np.isclose(get_config("default").prkv.alpha, 0.85)


def test_named_zoo_model_is_loaded_by_name(tmp_path):
    """``--config.model=<zoo name>`` loads that named LM; one whose max_len cannot hold the
    prompts is refused before any evaluation, with the sizes in the message."""
    config = get_config("test")
    config.model = "lm-test"  # max_len 64 < the test preset's ~100-token prompts
    with pytest.raises(ValueError, match=r"prompts of \d+ tokens .* exceed the model's "
                                         r"max_len 64"):
        exp.run(config, str(tmp_path))
    model, _, info = exp.load_model(config)
    assert info["source"].startswith("lm-test-") and model.config.max_len == 64


def test_default_model_was_fine_tuned_on_the_default_tasks():
    """The default preset evaluates lm-xs-long on the tasks, lengths and difficulties it was
    fine-tuned on: a change to one side without the other would test it off-distribution."""
    from lab.zoo.spec import NAMED
    config = get_config("default")
    trained = NAMED[config.model].data["tasks"]
    for task, kwargs in exp.task_kwargs(config).items():
        assert {k: v for k, v in trained[task].items() if k != "weight"} == kwargs, task
