"""Speed of a full RL step (generation + scoring + update): ``lab.train.rl`` against trl.

Both sides run the same randomly initialised Qwen3 (benchmarks/decode.py's
:data:`CONFIG`: hidden 256, 4 layers, 8 heads, 2 KV heads, head_dim 32, vocab
256): the benchmark builds ``Qwen3ForCausalLM``, copies its weights into
``lab.nn.Transformer`` (``lab.hf``'s loader) and checks that the logits agree.
Each RL step samples ``--group`` completions for each of ``--prompts`` prompts of
``--prompt-len`` tokens, at most ``--new`` new tokens at temperature 1 (EOS stops a
row on both sides), scores them with the same exact-match reward
(``lab.train.rewards``) and takes one optimizer update of the GRPO loss
(sequence-level aggregation, trl's ``loss_type="grpo"``, no KL, AdamW): Lab's
:class:`lab.train.rl.RLTrainer` against trl's ``GRPOTrainer`` (transformers + torch,
no vLLM) with the same group size, batch and lengths, on this CPU in one process.

Both are warmed up first (Lab: compilation; trl: one step); then each side runs
``--repeats`` rounds of ``--steps`` steps and its best round is reported (trl's
rounds run inside one ``train()`` call, then Lab's, so the sides are not
interleaved: load from other processes can favour either). Prints samples/s
(completions per second of a whole step), the ratio, the share of each step
spent generating, and the mean completion length (EOS from the random model ends
some completions early on both sides).

    python benchmarks/rl.py [--prompts 4] [--group 4] [--prompt-len 32] [--new 32]
                            [--steps 3] [--repeats 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from benchmarks.decode import CONFIG, hf_model, lab_from_hf  # noqa: E402
from lab import infer  # noqa: E402
from lab.train import rewards  # noqa: E402
from lab.train.rl import RLConfig, RLTrainer  # noqa: E402

# A character vocabulary inside the model's 256 ids: printable ASCII, then specials.
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
PAD, EOS, BOS, UNK = 252, 253, 254, 255


class CharTokenizer:
    """Lab's tokenizer interface over :data:`CHARS` (the ids the HF tokenizer uses)."""

    pad_id, eos_id, bos_id = PAD, EOS, BOS
    vocab_size = 256

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = [CHARS.index(c) if c in CHARS else UNK for c in text]
        return ([BOS] if add_bos else []) + ids + ([EOS] if add_eos else [])

    def decode(self, ids) -> str:
        return "".join(CHARS[i] for i in np.asarray(list(ids)).ravel() if i < len(CHARS))


def hf_tokenizer() -> PreTrainedTokenizerFast:
    """The same character vocabulary as a ``transformers`` fast tokenizer (for trl)."""
    vocab = {c: i for i, c in enumerate(CHARS)}
    vocab.update({"<pad>": PAD, "<eos>": EOS, "<bos>": BOS, "<unk>": UNK})
    for i in range(len(CHARS), PAD):
        vocab[f"<r{i}>"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>")


def prompts_dataset(n: int, length: int, seed: int = 0) -> datasets.Dataset:
    """``n`` prompts of exactly ``length`` characters (one-digit sums padded with spaces)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        a, b = (int(x) for x in rng.integers(0, 10, 2))
        text = f"{a}+{b}=?\n"
        rows.append({"prompt": " " * (length - len(text)) + text, "answer": str(a + b)})
    return datasets.Dataset.from_list(rows)


def trl_reward(prompts, completions, answer, **_):
    """trl's reward signature on Lab's registered exact-match reward."""
    return rewards.score(["exact_match"], prompts, completions, {"answer": answer}).total.tolist()


def build_trl(hf, data, args, workdir):
    from trl import GRPOConfig, GRPOTrainer

    n = args.prompts * args.group
    config = GRPOConfig(
        output_dir=workdir, per_device_train_batch_size=n, num_generations=args.group,
        max_completion_length=args.new, temperature=1.0, top_p=1.0, learning_rate=1e-5,
        beta=0.0, loss_type="grpo", num_iterations=1, max_steps=10_000, logging_steps=10_000,
        save_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=0,
        dataloader_num_workers=0, disable_tqdm=True, shuffle_dataset=False)
    trainer = GRPOTrainer(model=hf, reward_funcs=[trl_reward], args=config, train_dataset=data,
                          processing_class=hf_tokenizer())
    trainer.generation_config.bos_token_id = None
    gen = {"seconds": 0.0}
    inner = trainer._generate_single_turn

    def timed_generate(*a, **k):
        t0 = time.perf_counter()
        out = inner(*a, **k)
        gen["seconds"] += time.perf_counter() - t0
        return out

    trainer._generate_single_turn = timed_generate
    return trainer, gen


class StepClock:
    """A ``transformers`` callback recording the wall time of each optimizer step."""

    def __init__(self):
        self.times, self._t0 = [], None

    def __call__(self):
        from transformers import TrainerCallback

        clock = self

        class _CB(TrainerCallback):
            def on_step_begin(self, *a, **k):
                clock._t0 = time.perf_counter()

            def on_step_end(self, *a, **k):
                clock.times.append(time.perf_counter() - clock._t0)

        return _CB()


def run_trl(args, hf, data):
    """Trains trl for ``1 + steps * repeats`` steps; returns per-round (step s, gen s)."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer, gen = build_trl(hf, data, args, tmp)
        clock = StepClock()
        trainer.add_callback(clock())
        marks = []

        from transformers import TrainerCallback

        total = 1 + args.steps * args.repeats

        class Rounds(TrainerCallback):
            def on_step_end(self, targs, state, control, **k):
                marks.append(gen["seconds"])
                if state.global_step >= total:
                    control.should_training_stop = True

        trainer.add_callback(Rounds())
        out = trainer.train()
    gens = np.diff([0.0] + marks)
    return np.array(clock.times), gens, float(out.metrics.get("completions/mean_length", np.nan))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

    hf = hf_model()
    lab = lab_from_hf(hf)
    probe = np.random.default_rng(0).integers(1, CONFIG["vocab_size"], (2, 16))
    with torch.no_grad():
        ref = hf(torch.from_numpy(probe)).logits.numpy()
    err = float(np.abs(np.asarray(infer.prefill(lab, probe)[0]) - ref).max())
    assert err < 1e-3, f"lab and transformers logits differ by {err}"
    hf.train()

    n = args.prompts * args.group
    data = prompts_dataset(args.prompts * (1 + args.steps * args.repeats), args.prompt_len)
    cfg = RLConfig(steps=1, prompts_per_step=args.prompts, group_size=args.group,
                   max_new_tokens=args.new, temperature=1.0, rewards=("exact_match",),
                   learning_rate=1e-5, optimizer="adamw", progress=False, add_bos=False,
                   max_prompt_len=args.prompt_len)
    tok = CharTokenizer()
    RLTrainer(lab, tok, cfg).fit(data)  # warm-up: compiles generate, the forward, the step

    # trl runs all its steps in one train() call; Lab's rounds run around it.
    trl_steps, trl_gen, trl_len = run_trl(args, hf, data)
    trl_steps, trl_gen = trl_steps[1:], trl_gen[1:]  # drop the warm-up step
    lab_rounds, lab_len = [], []
    for r in range(args.repeats):
        trainer = RLTrainer(lab, tok, cfg.replace(steps=args.steps, seed=r + 1))
        trainer.fit(data)
        lab_rounds.append(trainer.timings)
        lab_len += [h["completion_length"] for h in trainer.history]

    def best(step_times, gen_times):
        rounds = [(float(np.sum(step_times[i:i + args.steps])),
                   float(np.sum(gen_times[i:i + args.steps])))
                  for i in range(0, len(step_times), args.steps)]
        return min(rounds)

    lab_best = min((sum(sum(t.values()) for t in rd), sum(t["generate"] for t in rd))
                   for rd in lab_rounds)
    trl_best = best(trl_steps, trl_gen)
    lab_sps = n * args.steps / lab_best[0]
    trl_sps = n * args.steps / trl_best[0]
    print(f"RL step: {args.prompts} prompts x {args.group} samples = {n} completions, prompt "
          f"{args.prompt_len} tokens, up to {args.new} new, {args.steps} steps x "
          f"{args.repeats} rounds (best), torch threads {args.threads}")
    print("| side | samples/s | step s | generating | mean completion tokens |")
    print("|---|---|---|---|---|")
    for name, (step, gen), sps, length in (
            ("lab.train.rl", lab_best, lab_sps, float(np.mean(lab_len))),
            ("trl GRPOTrainer", trl_best, trl_sps, trl_len)):
        print(f"| {name} | {sps:.1f} | {step / args.steps:.3f} | {gen / step:.0%} | "
              f"{length:.1f} |")
    print(f"ratio lab / trl: {lab_sps / trl_sps:.2f}x")


if __name__ == "__main__":
    main()
