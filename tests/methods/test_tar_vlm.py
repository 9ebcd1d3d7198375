"""The TAR VLM (lab.methods.tar.vlm): its tokenizer gives the annotations back exactly, the
SFT batch masks the answer only, temporal patches hold two consecutive frames in the
processor's layout, the perception targets mark the anomalous actors, fine-tuning
separates two videos that only their pixels tell apart (and cannot when the frames are
blanked), the perception loss teaches where an actor is, and the predictor runs through
the harness on a synthetic split on disk."""

import numpy as np
import pytest

from lab.methods import tar
from lab.methods.tar import labels, synthetic
from lab.methods.tar import vlm as tv
from lab.nn.vlm import rope_index

SHAPE = tv.VideoShape(frames=2, height=16, width=32, patch_size=8)


def _labelled(n=5, seed=0):
    vids = tar.make_videos(seed, n)
    rng = np.random.default_rng(seed)
    return vids, [it for vid, _, log in vids for it in labels.label_video(vid, log, rng)]


def test_pieces_and_tokenizer_give_every_annotation_back_exactly():
    _, items = _labelled()
    texts = [s for it in items for s in (it.question, it.answer)]
    texts += ["two  spaces\nand a tab\t", "ünïcode ✓"]
    tok = tv.TarTokenizer.fit(texts)
    assert tok.vocab[:len(tv.SPECIALS)] == tv.SPECIALS
    for t in texts:
        assert "".join(tv.pieces(t)) == t
        assert tok.decode(tok.encode(t)) == t
    ids = tok.encode('{"start": "1.375", "end": "2.5"}')
    assert tok.decode([*ids, tok.eos_id, *ids]) == '{"start": "1.375", "end": "2.5"}'
    assert tok.encode(" zebraquagga") == [tok.unk_id]          # an unseen piece
    with pytest.raises(ValueError, match="SPECIALS"):
        tv.TarTokenizer(["a", *tv.SPECIALS])


def test_trace_names_each_videos_event_and_the_evaluator_scores_what_follows_it():
    vids, items = _labelled(n=6)
    by_task = {t: [it for it in items if it.task == t] for t in tar.TASKS}
    traces = tv.event_traces(by_task)
    assert traces == {vid: labels.TYPE_TEXT[log["type"]] for vid, _, log in vids}
    traced = tv.with_trace(items, traces, choice_text=True)
    for it, tr in zip(items, traced, strict=True):
        assert tr.answer.startswith(f"<think> {traces[it.video_id]}</think> ")
        if it.task == "mcq":     # the option's text, which the evaluator reads as its letter
            assert tr.answer.endswith(traces[it.video_id])
            assert metrics_accuracy(tr, it, "choice") == 1.0
        else:
            assert tr.answer.endswith(it.answer)
        if it.task == "bcq":
            assert metrics_accuracy(tr, it, "yes_no") == 1.0
    # a video without an mcq answer keeps plain answers; letters stay letters by default
    assert tv.with_trace(items[:1], {}) == items[:1]
    mcq = by_task["mcq"][0]
    assert tv.with_trace([mcq], traces)[0].answer.endswith(f"</think> {mcq.answer}")


def metrics_accuracy(pred, item, kind):
    return tar.metrics.accuracy([pred.answer], [item.answer], kind, [item.question])["score"]


def _tok():
    return tv.TarTokenizer.fit(["Is it red? Answer Yes or No.", "Yes", "No"])


def test_sft_batch_masks_the_answer_and_eos_and_positions_follow_rope_index():
    tok = _tok()
    cfg = tv.model_config(tok, SHAPE, d_model=32, n_layers=1, vision_layers=1, max_len=64)
    videos = np.zeros((2, SHAPE.pixel_frames, 16, 32, 3), np.uint8)
    q = "Is it red? Answer Yes or No."
    b = tv.encode(cfg, tok, SHAPE, videos, [q, q], ["Yes", "No"], width=48)
    prompt = tv.prompt_ids(tok, q, SHAPE)
    n = len(prompt)
    assert b["inputs"].shape == (2, 48) and b["targets"].shape == (2, 48)
    assert (b["inputs"] == tok.video_id).sum(1).tolist() == [2 * SHAPE.tokens_per_frame] * 2
    np.testing.assert_array_equal(b["inputs"][0, :n], prompt)
    np.testing.assert_array_equal(b["targets"][0, :n + 1], [*prompt[1:], tok.index["Yes"],
                                                            tok.eos_id])
    # the loss sees the answer token (predicted at <answer>) and <eos>, nothing else
    assert np.flatnonzero(b["mask"][0]).tolist() == [n - 1, n]
    rope, nxt = rope_index(b["inputs"], cfg, None, np.array([SHAPE.grid] * 2),
                           np.array([n + 1, n + 1]))
    np.testing.assert_array_equal(b["rope"], rope)
    np.testing.assert_array_equal(b["nxt"], nxt)
    assert b["pixels"].shape == (2 * 2 * 2 * 4, 3 * 2 * 8 * 8)   # rows, C x Tp x P x P
    with pytest.raises(ValueError, match=r"videos have shape \(2, 4, 16, 16, 3\)"):
        tv.encode(cfg, tok, SHAPE, videos[:, :, :, :16], [q, q], ["Yes", "No"])
    with pytest.raises(ValueError, match="width=8"):
        tv.encode(cfg, tok, SHAPE, videos, [q, q], ["Yes", "No"], width=8)
    with pytest.raises(ValueError, match="TransformerConfig.max_len=64"):
        tv.encode(cfg, tok, SHAPE, videos, [q * 8] * 2)
    with pytest.raises(ValueError, match="multiples of patch_size x merge = 16"):
        tv.VideoShape(height=24, merge=2)


def _two_videos():
    """Two videos that differ only in their pixels: a dark and a bright one."""
    dark = np.full((4, 16, 32, 3), 20, np.uint8)
    bright = np.full((4, 16, 32, 3), 230, np.uint8)
    q = "Is it red? Answer Yes or No."
    items = [tar.Item("bcq", "dark", q, "No"), tar.Item("bcq", "bright", q, "Yes")]
    return {"dark": dark, "bright": bright}, items


@pytest.mark.parametrize("blank", [False, True])
def test_finetuning_reads_the_pixels_and_the_blanked_control_cannot(blank):
    videos, items = _two_videos()
    tok = _tok()
    cfg = tv.model_config(tok, SHAPE, d_model=32, n_layers=1, vision_layers=1, max_len=64)
    model = tv.new_model(cfg, 0)
    model, history = tv.finetune(model, tok, SHAPE, items, videos,
                                 tv.FinetuneConfig(steps=40, batch=2, learning_rate=1e-2,
                                                   warmup=2, blank=blank))
    assert history[-1]["loss"] < history[0]["loss"]
    fn = tv.predictor(model, tok, SHAPE, max_new_tokens=3, batch_size=4, blank=blank)
    got = fn(items, [videos["dark"], videos["bright"]])
    if blank:   # the same prompt without pixels: one answer for both
        assert got[0] == got[1]
    else:
        assert got == ["No", "Yes"]
        # a budget past the model's max_len stops at max_len instead of failing
        far = tv.predictor(model, tok, SHAPE, max_new_tokens=10_000, batch_size=4)
        assert [a[:len(g)] for a, g in zip(far(items, [videos["dark"], videos["bright"]]),
                                           got, strict=True)] == got


def test_finetune_refuses_items_it_cannot_train_on():
    videos, items = _two_videos()
    tok = _tok()
    model = tv.new_model(tv.model_config(tok, SHAPE, d_model=32, n_layers=1,
                                         vision_layers=1, max_len=64), 0)
    with pytest.raises(ValueError, match="no frames for video"):
        tv.finetune(model, tok, SHAPE, items, {"dark": videos["dark"]})
    with pytest.raises(ValueError, match="needs its answer"):
        tv.finetune(model, tok, SHAPE, [tar.Item("bcq", "dark", "q", None)], videos)


def test_predictor_runs_through_the_harness_on_a_split_on_disk(tmp_path):
    root = str(tmp_path)
    vids = tar.make_videos(3, 3, prefix="test", n_frames=24)
    tar.write_split(root, vids, "test", seed=3)
    test, _ = tar.load_test(f"{root}/test/test.json")
    tok = tv.TarTokenizer.fit(s for it in test for s in (it.question, it.answer))
    shape = tv.VideoShape(frames=3)
    model = tv.new_model(tv.model_config(tok, shape, d_model=32, n_layers=1,
                                         vision_layers=1), 0)
    fn = tv.predictor(model, tok, shape, max_new_tokens=4, batch_size=8)
    preds = tar.predict(fn, test, media_root=f"{root}/videos", batch_size=5)
    assert len(preds) == len(test) and all(isinstance(p, str) for p in preds.values())
    # padding a call's rows to the batch size changes no row's answer
    alone = fn(test[:1], [tar.load_frames(test[0].video_id, f"{root}/videos")])
    assert alone[0] == preds[test[0].key(0)]
    res = tar.evaluate(preds, test)
    assert set(res["tasks"]) == set(tar.TASKS)
    with pytest.raises(ValueError, match="needs frames"):
        fn(test[:1], [None])
    # a question with words the tokenizer never saw (<unk>) is still answered
    odd = tar.Item("bcq", test[0].video_id, "Does a zeppelin land here? Answer Yes or No.", None)
    assert tok.encode(" zeppelin") == [tok.unk_id]
    assert isinstance(fn([odd], [tar.load_frames(odd.video_id, f"{root}/videos")])[0], str)


def test_sample_frames_takes_consecutive_pairs_spread_over_the_video():
    frames = (np.arange(48)[:, None, None, None] * np.ones((1, 2, 2, 3))).astype(np.uint8)
    shape = tv.VideoShape(frames=4)
    got = tv.sample_frames(frames, shape)[:, 0, 0, 0].tolist()
    assert got == [0, 1, 15, 16, 31, 32, 46, 47]
    with pytest.raises(ValueError, match="shorter than one temporal patch"):
        tv.frame_positions(1, shape)


def test_patchify_lays_out_channel_frame_row_column_per_patch():
    shape = tv.VideoShape(frames=1, height=16, width=16, patch_size=8)
    frames = np.random.default_rng(0).integers(0, 256, (2, 16, 16, 3)).astype(np.uint8)
    x = tv.patchify(frames, shape)
    assert x.shape == (4, 3 * 2 * 64)
    scaled = frames.astype(np.float32) / 127.5 - 1.0
    for k, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):      # row-major patches
        want = scaled[:, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8].transpose(3, 0, 1, 2)
        np.testing.assert_allclose(x[k], want.reshape(-1), atol=1e-6)


def test_actor_states_and_region_targets_mark_each_anomaly_during_its_event():
    shape = tv.VideoShape(frames=16)
    tok = tv.TarTokenizer.fit(["x"])
    state_of = {"collision": "stopped", "wrong_way": "wrong_way", "stalled": "stopped",
                "jaywalking": "jaywalker"}
    for seed, event in enumerate(synthetic.EVENT_TYPES * 3):
        frames, log = synthetic.generate_video(100 + seed, event)
        states = synthetic.actor_states(frames)
        regions = tv.region_targets(frames, shape, tok)
        anomalous = {tok.index[f"<{s}>"] for s in ("stopped", "wrong_way", "jaywalker")}
        found = set(regions.ravel().tolist()) & anomalous
        if event == "normal":
            assert not found
            normal = [synthetic.STATES.index(k) for k in ("car", "pedestrian")]
            assert all(np.isin(s[s >= 0], normal).all() for _, s in states.values())
            continue
        want = synthetic.STATES.index(state_of[event])
        actor = log["actors"][0]["colour"]
        _, s = states[actor]
        during = s[log["start"]:log["end"] + 1]
        assert (during == want).mean() >= 0.5, (event, during)
        assert tok.index[f"<{state_of[event]}>"] in found
        # the targets mark the actors' tokens only: most of the frame is empty
        assert (regions == tok.pad_id).mean() > 0.7


def test_perception_loss_teaches_where_the_actor_is():
    """A bright 8x8 block at a random cell of a dark video is a '<car>'; after training on
    the perception loss alone every held-out block is found and nothing else is marked."""
    shape = tv.VideoShape(frames=1, height=16, width=32, patch_size=8)
    tok = tv.TarTokenizer.fit(["x"])
    rng = np.random.default_rng(0)

    def make(n):
        videos, regions = {}, {}
        for i in range(n):
            v = np.full((2, 16, 32, 3), 30, np.uint8)
            r, c = rng.integers(0, 2), rng.integers(0, 4)
            v[:, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8] = 220
            t = np.full((1, 8), tok.pad_id, np.int32)
            t[0, r * 4 + c] = tok.index["<car>"]
            videos[f"v{i}"], regions[f"v{i}"] = v, t
        return videos, regions

    videos, regions = make(32)
    cfg = tv.model_config(tok, shape, d_model=32, n_layers=1, vision_layers=1, max_len=32)
    model = tv.new_model(cfg, 0)
    items = [tar.Item("scene_description", v, "", "") for v in videos]
    model, _ = tv.finetune(model, tok, shape, items, videos,
                           tv.FinetuneConfig(steps=60, batch=8, learning_rate=1e-2, warmup=2,
                                             answer_weight=0.0, region_weight=1.0),
                           regions=regions)
    held, held_regions = make(16)
    got = tv.region_recall(model, tok, shape, held, held_regions, batch_size=8)
    assert got["<car>"]["n"] == 16 and got["<car>"]["recall"] == 1.0
    assert got["<pad>"]["recall"] == 1.0 and got["<stopped>"]["n"] == 0
    with pytest.raises(ValueError, match="needs region targets"):
        tv.finetune(model, tok, shape, items, videos, tv.FinetuneConfig(region_weight=1.0))
