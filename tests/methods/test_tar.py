"""TAR tooling: the schema loader and submission CSV on fixtures written here (wrong
schemas and malformed predictions included), the per-task evaluators, BERTScore against
the ``bert-score`` package and a hand computation on a tiny random BERT, the synthetic
generator's labels against its frames, the shortcut baselines near chance, the harness
and the TFDS builder."""

import json
import os

import numpy as np
import pytest

from lab.methods import tar
from lab.methods.tar import labels, metrics, schema, shortcuts, synthetic

# --- schema ---------------------------------------------------------------------------


def _train_item(i, **over):
    return {"video_id": f"src/v{i}", "question": f"Is there a crash {i}?",
            "answer": "Yes", "reasoning": "Step 1: look.", **over}


def _write(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f)
    return str(path)


def test_train_files_load_with_their_fields_and_extra_keys(tmp_path):
    for task in ("bcq", "open_qa"):
        _write(tmp_path / "train" / f"{task}.json",
               {"media_root": "./videos",
                "items": [_train_item(0, source="TAD"), _train_item(1)]})
    data = tar.load_train(str(tmp_path))
    assert set(data) == {"bcq", "open_qa"}
    first = data["bcq"][0]
    assert (first.task, first.video_id, first.answer, first.reasoning) == (
        "bcq", "src/v0", "Yes", "Step 1: look.")
    assert first.extra == {"source": "TAD"} and first.item_index is None
    # the media root: the argument, else the train files' media_root key, from the root
    assert tar.resolve_media_root(str(tmp_path)) == os.path.join(str(tmp_path), "./videos")
    assert tar.resolve_media_root(str(tmp_path), "/mnt/v") == "/mnt/v"
    with pytest.raises(FileNotFoundError, match="mcq.json"):
        tar.load_train(str(tmp_path), tasks=["mcq"])


@pytest.mark.parametrize("items, field, where", [
    ([_train_item(0), {k: v for k, v in _train_item(1).items() if k != "answer"}],
     "answer", "item 1"),
    ([_train_item(0), _train_item(1), _train_item(2, reasoning=3)], "reasoning", "item 2"),
    ([_train_item(0, video_id="")], "video_id", "item 0"),
    ([_train_item(0, question=None)], "question", "item 0"),
])
def test_a_wrong_schema_names_the_file_the_item_and_the_field(tmp_path, items, field, where):
    path = _write(tmp_path / "train" / "bcq.json", {"items": items})
    with pytest.raises(tar.SchemaError) as err:
        tar.load_task(path)
    msg = str(err.value)
    assert path in msg and where in msg and repr(field) in msg, msg


def test_a_file_without_an_items_list_or_not_json_is_refused(tmp_path):
    path = _write(tmp_path / "mcq.json", {"entries": []})
    with pytest.raises(tar.SchemaError, match=r"mcq.json: field 'items' is missing"):
        tar.load_task(path)
    path = _write(tmp_path / "mcq.json", {"items": {"a": 1}})
    with pytest.raises(tar.SchemaError, match="expected a list"):
        tar.load_task(path)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(tar.SchemaError, match="bad.json: not valid JSON"):
        tar.load_task(str(tmp_path / "bad.json"), "bcq")
    with pytest.raises(ValueError, match="task='bcqq' is unknown"):
        tar.load_task(path, "bcqq")


def _test_items(redacted):
    ans = None if redacted else "Yes"
    return [{"item_index": "00ab", "task": "bcq", "video_id": "v=1_0-00_0-16",
             "question": "Crash?", "answer": ans},
            {"item_index": "00ac", "task_type": "temporal_localization",
             "video_id": "v=1_0-00_0-16", "question": "When?",
             **({} if redacted else {"answer": '{"start": "1.0", "end": "2.0"}'})}]


def test_the_test_split_has_item_indices_and_redacted_answers(tmp_path):
    path = _write(tmp_path / "test.json", {"metadata": {"answers_redacted": True},
                                           "items": _test_items(True)})
    items, redacted = tar.load_test(path)
    assert redacted and [it.item_index for it in items] == ["00ab", "00ac"]
    assert [it.task for it in items] == ["bcq", "temporal_localization"]
    assert all(it.answer is None for it in items)
    with pytest.raises(ValueError, match="redacted split cannot be scored"):
        tar.evaluate({"00ab": "Yes", "00ac": "{}"}, items)
    # not redacted: a missing answer is a schema error naming the item and the field
    path = _write(tmp_path / "t2.json", {"items": _test_items(False)[:1] + [
        {k: v for k, v in _test_items(False)[1].items() if k != "answer"}]})
    with pytest.raises(tar.SchemaError, match=r"t2.json: item 1: field 'answer' is missing"):
        tar.load_test(path)


@pytest.mark.parametrize("change, field", [
    ({"item_index": None}, "item_index"), ({"item_index": "00ac"}, "item_index"),
    ({"task": "vqa"}, "task"),
])
def test_a_wrong_test_item_names_the_field(tmp_path, change, field):
    items = _test_items(False)
    items[0].update(change)
    path = _write(tmp_path / "test.json", {"items": items[::-1]})
    with pytest.raises(tar.SchemaError, match=rf"item 1: field '{field}'"):
        tar.load_test(path)


def test_submission_csv_round_trips_multiline_predictions_and_checks_rows(tmp_path):
    path = str(tmp_path / "sub.csv")
    preds = {"00ab": "Yes, because\nthe car, red, stops.", "00ac": '{"start": "1", "end": "2"}'}
    tar.write_submission(path, preds)
    assert open(path).readline() == "item_index,prediction\n"
    items, _ = tar.load_test(_write(tmp_path / "t.json", {"items": _test_items(False)}))
    assert tar.read_submission(path, items) == preds
    tar.write_submission(path, {"00ab": "Yes"})
    with pytest.raises(tar.SchemaError, match="1 test items have no prediction"):
        tar.read_submission(path, items)
    tar.write_submission(path, {**preds, "ffff": "No"})
    with pytest.raises(tar.SchemaError, match="not in the test split"):
        tar.read_submission(path, items)
    (tmp_path / "dup.csv").write_text("item_index,prediction\n00ab,Yes\n00ab,No\n")
    with pytest.raises(tar.SchemaError, match="row 3: field 'item_index' '00ab' repeats"):
        tar.read_submission(str(tmp_path / "dup.csv"))
    (tmp_path / "hdr.csv").write_text("id,prediction\n00ab,Yes\n")
    with pytest.raises(tar.SchemaError, match="expected exactly"):
        tar.read_submission(str(tmp_path / "hdr.csv"))
    with pytest.raises(ValueError, match="expected a string"):
        tar.write_submission(path, {"00ab": 1})


def test_frames_load_from_an_image_folder_under_the_media_root(tmp_path):
    frames = np.random.default_rng(0).integers(0, 256, (5, 6, 7, 3), dtype=np.uint8)
    schema.save_frames(frames, str(tmp_path / "media" / "src" / "clip1"))
    got = tar.load_frames("src/clip1", str(tmp_path / "media"))
    np.testing.assert_array_equal(got, frames)
    assert tar.load_frames("src/clip1", str(tmp_path / "media"), stride=2).shape[0] == 3
    np.testing.assert_array_equal(
        tar.load_frames("src/clip1", str(tmp_path / "media"), max_frames=2), frames[[0, 4]])
    with pytest.raises(FileNotFoundError, match="no frame folder for video_id='src/none'"):
        tar.load_frames("src/none", str(tmp_path / "media"))
    with pytest.raises(ValueError, match="outside media_root"):
        tar.load_frames("../../etc", str(tmp_path / "media"))


# --- evaluators -----------------------------------------------------------------------


def test_yes_no_and_choice_normalisation():
    for text in ("Yes", "yes.", " **Yes**, the car stops", "<answer>YES</answer>",
                 "Answer: yes", "<think>no idea</think> Yes"):
        assert metrics.normalise_yes_no(text) == "yes", text
    for text in ("Maybe", "", "The answer is yes", None, "Yesterday"):
        assert metrics.normalise_yes_no(text) is None, text
    q = "Which event?\nA. a stalled car\nB. a collision between cars\nC. normal traffic"
    opts = metrics.parse_options(q)
    assert opts == {"A": "a stalled car", "B": "a collision between cars", "C": "normal traffic"}
    for text in ("B", "B.", "(B)", "b) a collision", "Answer: B", "option B",
                 "A collision between cars."):
        assert metrics.normalise_choice(text, opts) == "B", text
    for text in ("Because the car", "D", "", "AB"):
        assert metrics.normalise_choice(text, opts) is None, text
    res = metrics.accuracy(["Yes", "no", "perhaps", "NO"], ["Yes", "Yes", "No", "No"], "yes_no")
    assert res == {"score": 0.5, "n": 4, "malformed": 1}


def test_temporal_iou_and_malformed_intervals_score_zero_and_are_counted():
    assert metrics.parse_interval('The event: {"start": "00:01.5", "end": "3s"} done') == (
        1.5, 3.0)
    assert metrics.parse_interval('{"start": 2, "end": 4}') == (2.0, 4.0)
    for bad in ('{"start": "a", "end": "2"}', '{"start": 3, "end": 1}', "from 1 to 2 s",
                '{"begin": 1, "end": 2}', '{"start": -1, "end": 2}', None, "{start: 1}"):
        assert metrics.parse_interval(bad) is None, bad
    assert metrics.temporal_iou((1, 3), (2, 4)) == pytest.approx(1 / 3)
    assert metrics.temporal_iou((0, 1), (2, 3)) == 0.0
    gt = ['{"start": "1", "end": "3"}'] * 4
    preds = ['{"start": "2", "end": "4"}', '{"start": "1", "end": "3"}', "garbage", None]
    res = metrics.mean_iou(preds, gt)
    assert res["malformed"] == 2 and res["score"] == pytest.approx((1 / 3 + 1) / 4)


def test_offline_text_metrics_by_hand():
    # ROUGE-L: LCS("red car stops lane", "red car stalled in lane") = red car lane = 3
    p, r = "the red car stops lane", "a red car stalled in lane"
    assert metrics.rouge_l(p, r) == pytest.approx(2 * (3 / 4) * (3 / 5) / (3 / 4 + 3 / 5))
    assert metrics.token_f1(p, r) == pytest.approx(2 * (3 / 4) * (3 / 5) / (3 / 4 + 3 / 5))
    assert metrics.rouge_l("lane car red", "red car lane") == pytest.approx(1 / 3)
    assert metrics.token_f1("lane car red", "red car lane") == 1.0
    res = metrics.text_similarity([p, "", None], [r, r, r])
    assert res["metric"] == "rouge_l" and res["malformed"] == 2
    assert res["score"] == pytest.approx(metrics.rouge_l(p, r) / 3)
    # a reasoning trace is dropped before scoring; a trace with nothing after it is empty
    traced = metrics.text_similarity([f"<think> a stalled car</think> {p}", "<think>x</think>"],
                                     [r, r])
    assert traced["score"] == pytest.approx(metrics.rouge_l(p, r) / 2)
    assert traced["malformed"] == 1


WORDS = ("a car truck stops in the lane collision pedestrian crosses road red blue wrong "
         "way stalled vehicle yes no at frame and then moves .").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ed"]


def _write_vocab(d):
    with open(os.path.join(d, "vocab.txt"), "w") as f:
        f.write("\n".join(VOCAB) + "\n")


@pytest.fixture(scope="module")
def numpy_bert(tmp_path_factory):
    """A tiny random BERT written with numpy + safetensors (no torch), BertModel names."""
    from safetensors.numpy import save_file

    d = str(tmp_path_factory.mktemp("npbert"))
    _write_vocab(d)
    rng = np.random.default_rng(0)
    h, inter, layers = 16, 32, 2
    n = lambda *shape: rng.normal(0, 0.5, shape).astype(np.float32)
    w = {"embeddings.word_embeddings.weight": 4 * n(len(VOCAB), h),
         "embeddings.position_embeddings.weight": n(32, h),
         "embeddings.token_type_embeddings.weight": n(2, h),
         "embeddings.LayerNorm.weight": 1 + n(h), "embeddings.LayerNorm.bias": n(h)}
    for i in range(layers):
        p = f"encoder.layer.{i}"
        for name, shape in (("attention.self.query", (h, h)), ("attention.self.key", (h, h)),
                            ("attention.self.value", (h, h)),
                            ("attention.output.dense", (h, h)),
                            ("intermediate.dense", (inter, h)), ("output.dense", (h, inter))):
            w[f"{p}.{name}.weight"], w[f"{p}.{name}.bias"] = n(*shape), n(shape[0])
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[f"{p}.{ln}.weight"], w[f"{p}.{ln}.bias"] = 1 + n(h), n(h)
    save_file(w, os.path.join(d, "model.safetensors"))
    _write(os.path.join(d, "config.json"), {
        "model_type": "bert", "hidden_size": h, "num_hidden_layers": layers,
        "num_attention_heads": 2, "intermediate_size": inter, "hidden_act": "gelu",
        "max_position_embeddings": 32, "layer_norm_eps": 1e-12, "vocab_size": len(VOCAB)})
    _write(os.path.join(d, "tokenizer_config.json"), {"do_lower_case": True})
    return d


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers.implementations import BertWordPieceTokenizer

    d = str(tmp_path_factory.mktemp("bert"))
    _write_vocab(d)
    tok = transformers.BertTokenizerFast(
        tokenizer_object=BertWordPieceTokenizer(os.path.join(d, "vocab.txt"),
                                                lowercase=True)._tokenizer,
        model_max_length=64)
    tok.save_pretrained(d)
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=3,
                                  num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=64, initializer_range=0.5)
    model = transformers.BertModel(cfg).eval()
    model.save_pretrained(d)
    return d, model, tok


CANDS = ["a red car stops in the lane", "the pedestrian crosses the road", "blue truck",
         "yes", "a vehicle moves the wrong way"]
REFS = ["the red car stalled in the lane .", "a pedestrian crosses the road at frame",
        "a truck moves the wrong way", "no", "a vehicle moves the wrong way"]


def test_bertscore_is_greedy_cosine_matching_without_special_token_weights(numpy_bert):
    scorer = tar.BERTScorer(numpy_bert)  # vocab.txt + tokenizer_config.json, no tokenizer.json
    got = scorer.score(CANDS, REFS)
    for i, (c, r) in enumerate(zip(CANDS, REFS, strict=True)):
        (ci, ce), (ri, re_) = scorer.encode(c), scorer.encode(r)
        assert ci[0] == 2 and ci[-1] == 3  # [CLS] ... [SEP]
        ce = ce / np.linalg.norm(ce, axis=1, keepdims=True)
        re_ = re_ / np.linalg.norm(re_, axis=1, keepdims=True)
        # precision: each candidate word's best cosine over every reference token (the
        # special ones included), averaged over the candidate's words only
        p = np.mean([max(float(ce[a] @ re_[b]) for b in range(len(ri)))
                     for a in range(1, len(ci) - 1)])
        rec = np.mean([max(float(re_[b] @ ce[a]) for a in range(len(ci)))
                       for b in range(1, len(ri) - 1)])
        np.testing.assert_allclose(got[i], [p, rec, 2 * p * rec / (p + rec)], atol=1e-9)
    assert got[4, 2] == pytest.approx(1.0)  # identical sentences
    assert got[:4, 2].std() > 0.01  # the random BERT discriminates: the test can fail
    with pytest.raises(ValueError, match="num_layers=7"):
        tar.BERTScorer(numpy_bert, num_layers=7)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        tar.BERTScorer(os.path.dirname(numpy_bert))


@pytest.mark.slow
def test_bertscore_encoder_matches_transformers_bert_model(tiny_bert):
    import torch

    d, model, tok = tiny_bert
    scorer = tar.BERTScorer(d, num_layers=2)
    got = scorer.score(CANDS, REFS)

    def emb(text):
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            h = model(**enc, output_hidden_states=True).hidden_states[2][0].numpy()
        ids = enc["input_ids"][0].numpy()
        return ids, h / np.linalg.norm(h, axis=1, keepdims=True)

    special = {tok.cls_token_id, tok.sep_token_id}
    for i, (c, r) in enumerate(zip(CANDS, REFS, strict=True)):
        (ci, ce), (ri, re_) = emb(c), emb(r)
        sim = ce @ re_.T
        keep_c = [k for k, t in enumerate(ci) if t not in special]
        keep_r = [k for k, t in enumerate(ri) if t not in special]
        p, rec = sim.max(1)[keep_c].mean(), sim.max(0)[keep_r].mean()
        np.testing.assert_allclose(got[i], [p, rec, 2 * p * rec / (p + rec)], atol=1e-5)


@pytest.mark.slow
def test_bertscore_matches_the_bert_score_package(tiny_bert):
    bert_score = pytest.importorskip("bert_score")
    d, _, _ = tiny_bert
    ours = tar.BERTScorer(d, num_layers=3).score(CANDS, REFS)
    p, r, f = bert_score.score(CANDS, REFS, model_type=d, num_layers=3, batch_size=8)
    np.testing.assert_allclose(ours, np.stack([p, r, f], 1), atol=1e-5)
    res = metrics.text_similarity(CANDS, REFS, scorer=tar.BERTScorer(d, num_layers=3))
    assert res["metric"] == "bertscore_f1"
    assert res["score"] == pytest.approx(float(f.mean()), abs=1e-5)


# --- the synthetic generator and its labels -------------------------------------------


def _boxes_of(frames, colour):
    return synthetic.blobs(frames)[colour]


def _event_frames(frames, log):
    """The frames where the logged anomaly is visible, read from the pixels."""
    lay, T = synthetic.LAYOUT, len(frames)
    cols = [a["colour"] for a in log["actors"]]
    b = [_boxes_of(frames, c) for c in cols]
    if log["type"] == "stalled":  # the car's box does not move
        same = np.zeros(T, bool)
        same[1:] = np.all(b[0][1:] == b[0][:-1], axis=1)
        same[:-1] |= same[1:].copy()
        return same
    if log["type"] == "collision":  # the two boxes touch
        a, c = b
        return np.isfinite(a[:, 0]) & np.isfinite(c[:, 0]) & (
            (a[:, 3] == c[:, 2]) | (c[:, 3] == a[:, 2])) & (a[:, 0] == c[:, 0])
    if log["type"] == "wrong_way":  # in the other lane's rows
        own = lay.lane_rows[("westbound", "eastbound").index(log["lane"])]
        return np.isfinite(b[0][:, 0]) & (b[0][:, 0] != own)
    if log["type"] == "jaywalking":  # on the road rows
        return (b[0][:, 1] > lay.road[0]) & (b[0][:, 0] < lay.road[1])
    raise AssertionError(log["type"])


@pytest.mark.parametrize("event", synthetic.ANOMALIES)
def test_temporal_localization_covers_the_frames_where_the_anomaly_is_seen(event):
    fps = 8.0
    for seed in range(4):
        frames, log = synthetic.generate_video(seed, event)
        assert frames.dtype == np.uint8 and frames.shape == (48, 48, 64, 3)
        seen = np.nonzero(_event_frames(frames, log))[0]
        assert len(seen) and seen.min() >= 2 and seen.max() <= len(frames) - 3, (seed, seen)
        assert np.array_equal(seen, np.arange(seen.min(), seen.max() + 1)), (seed, seen)
        q = labels.question("temporal_localization", log, np.random.default_rng(0))
        ans, reasoning = labels.answer("temporal_localization", q, log, fps)
        start, end = metrics.parse_interval(ans)
        assert (round(start * fps), round(end * fps) - 1) == (seen.min(), seen.max()), seed
        assert reasoning.startswith("Step 1")
        if event == "collision":  # cleared after the event: both cars are gone
            for c in log["actors"]:
                assert np.isnan(_boxes_of(frames, c["colour"])[seen.max() + 1:, 0]).all()


def test_normal_videos_show_no_anomaly_and_generation_is_seeded():
    for seed in range(5):
        frames, log = synthetic.generate_video(seed, "normal")
        assert log["type"] == "normal" and log["start"] is None
        assert synthetic.track_events(frames)["type"] == "normal"
    a, la = synthetic.generate_video(11)
    b, lb = synthetic.generate_video(11)
    assert np.array_equal(a, b) and la == lb
    assert not np.array_equal(a, synthetic.generate_video(12)[0])
    with pytest.raises(ValueError, match="event='fire'"):
        synthetic.generate_video(0, "fire")


def test_the_frame_tracker_reads_the_event_log_back_from_pixels():
    for seed in range(12):
        frames, log = synthetic.generate_video(100 + seed)
        est = synthetic.track_events(frames)
        assert (est["type"], est["start"], est["end"], est["lane"]) == (
            log["type"], log["start"], log["end"], log["lane"]), seed
        assert [a["colour"] for a in est["actors"]] == [a["colour"] for a in log["actors"]]
        assert {k: est["scene"][k] for k in ("cars", "pedestrians", "speeds")} == {
            k: log["scene"][k] for k in ("cars", "pedestrians", "speeds")}


def test_labels_agree_with_the_event_log_for_every_task():
    rng = np.random.default_rng(0)
    for seed in range(10):
        frames, log = synthetic.generate_video(seed)
        items = labels.label_video(f"v{seed}", log, rng)
        by = {it.task: it for it in items}
        assert set(by) == set(tar.TASKS) - ({"temporal_localization"}
                                            if log["type"] == "normal" else set())
        assert labels.type_of_answer(by["mcq"]) == log["type"]
        assert (by["bcq"].answer == "Yes") == (labels.asked_type(by["bcq"].question)
                                                == log["type"])
        assert by["bcq_openended"].answer.startswith("No" if log["type"] == "normal" else "Yes")
        for a in log["actors"]:
            assert a["colour"] in by["open_qa"].answer
        assert all(it.reasoning for it in items)


# --- a split on disk, the shortcuts and the harness -----------------------------------


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tar"))
    tar.write_split(root, tar.make_videos(0, 50, prefix="tr"), "train", seed=0)
    tar.write_split(root, tar.make_videos(1, 40, prefix="te"), "test", seed=1)
    train = tar.load_train(root)
    test, redacted = tar.load_test(os.path.join(root, "test", "test.json"))
    assert not redacted
    return root, train, test


def test_the_loader_reads_the_auto_labeller_output(split):
    root, train, test = split
    assert set(train) == set(tar.TASKS) and len(train["bcq"]) == 50
    assert len(train["temporal_localization"]) == 40  # one video in five is normal
    assert len({it.item_index for it in test}) == len(test) == 40 * 9 - 8
    events = json.load(open(os.path.join(root, "test_events.json")))
    for it in test:
        if it.task == "mcq":
            assert labels.type_of_answer(it) == events[it.video_id]["type"]
    assert tar.resolve_media_root(root) == os.path.join(root, "videos")
    frames = tar.load_frames(test[0].video_id, tar.resolve_media_root(root))
    assert frames.shape == (48, 48, 64, 3)


def test_answers_are_balanced_so_majority_and_position_stay_at_chance(split):
    _, train, test = split
    yes = np.mean([it.answer == "Yes" for it in train["bcq"]])
    assert 0.35 <= yes <= 0.65, yes
    letters = [it.answer for it in train["mcq"]]
    assert max(letters.count(x) for x in "ABCDE") / len(letters) <= 0.36
    types = [labels.type_of_answer(it) for it in train["mcq"]]
    assert max(types.count(t) for t in synthetic.EVENT_TYPES) / len(types) == 0.2


def _accuracy(fn, test, media, task, cache=None):
    items = [it for it in test if it.task == task]
    res = tar.evaluate(tar.predict(fn, items, media_root=media, frames_cache=cache), items)
    return res["tasks"][task]["score"]


def test_shortcut_baselines_stay_near_chance(split):
    root, train, test = split
    media = os.path.join(root, "videos")
    frames = {v: tar.load_frames(v, media) for v in shortcuts.video_types(train)}
    fns = {"majority": shortcuts.fit_majority(train),
           "question_only": shortcuts.fit_question_only(train),
           "first_frame": shortcuts.fit_frame_rule(train, media, "first", frames=frames),
           "last_frame": shortcuts.fit_frame_rule(train, media, "last", frames=frames)}
    cache = {}
    for name, fn in fns.items():
        where = media if name.endswith("frame") else None
        assert _accuracy(fn, test, where, "bcq", cache) <= 0.5 + 0.15, name
        assert _accuracy(fn, test, where, "mcq", cache) <= 0.2 + 0.15, name
    tl = [it for it in test if it.task == "temporal_localization"]
    prior = tar.evaluate(tar.predict(fns["majority"], tl), tl)["tasks"]
    assert prior["temporal_localization"]["score"] < 0.35
    # the tracker reads the answers from the frames: the task is not impossible
    mcq = [it for it in test if it.task == "mcq"][:12]
    assert _accuracy(shortcuts.tracker(), mcq, media, "mcq", cache) == 1.0


def test_harness_counts_malformed_and_missing_predictions_and_averages_groups(split):
    _, _, test = split
    seen = []

    def garbage(items, frames):
        seen.extend(it.answer for it in items)
        return ["I cannot tell."] * len(items)

    preds = tar.predict(garbage, test, batch_size=7)
    assert set(seen) == {None}  # the predictor never sees an answer
    del preds[test[0].key(0)]
    res = tar.evaluate(preds, test)
    tasks = res["tasks"]
    assert tasks["bcq"]["malformed"] == tasks["bcq"]["n"] == 40
    assert tasks["bcq"]["score"] == 0 and tasks["temporal_localization"]["score"] == 0
    assert tasks["temporal_localization"]["malformed"] == 32
    assert tasks[test[0].task]["missing"] == 1
    assert res["groups"]["scene_understanding"] == tasks["scene_description"]["score"]
    assert res["aggregate"] == pytest.approx(np.mean([t["score"] for t in tasks.values()]))
    with pytest.raises(ValueError, match="returned 1 predictions for 7"):
        tar.predict(lambda items, frames: ["x"], test, batch_size=7)


def test_tfds_builder_round_trips_the_annotations(split, tmp_path):
    pytest.importorskip("tensorflow_datasets")
    pytest.importorskip("array_record")
    from lab.data import tfds as ltfds
    from lab.methods.tar import tfds_builder

    root, train, test = split
    builder = tfds_builder.build_annotations(root, str(tmp_path))
    data = ltfds.load(builder.data_dir)
    assert len(data["train"]) == sum(len(v) for v in train.values())
    assert len(data["test"]) == len(test)
    first = data["test"][0]
    assert first["item_index"] == test[0].item_index and first["answer"] == test[0].answer


def test_a_redacted_test_file_validates_a_submission_but_cannot_be_scored(split, tmp_path):
    _, _, test = split
    path = str(tmp_path / "test.json")
    schema.write_test(path, test, redact=True)
    items, redacted = tar.load_test(path)
    assert redacted and all(it.answer is None and it.reasoning is None for it in items)
    assert [it.item_index for it in items] == [it.item_index for it in test]
    sub = str(tmp_path / "sub.csv")
    tar.write_submission(sub, tar.predict(shortcuts.fit_majority({"bcq": test[:3]}), items))
    assert len(tar.read_submission(sub, items)) == len(items)
    with pytest.raises(ValueError, match="redacted split cannot be scored"):
        tar.evaluate(tar.read_submission(sub, items), items)
    with pytest.raises(ValueError, match="has no item_index"):
        schema.write_test(path, [labels.label_video("v", {**synthetic.generate_video(0)[1]},
                                                    np.random.default_rng(0))[0]])


def test_choice_chance_is_the_majority_rate_or_one_over_the_options():
    items = [tar.Item("bcq", "v", "q", a) for a in ("Yes", "Yes", "Yes", "No")]
    items += [tar.Item("mcq", "v", "q", a) for a in "ABCDE"]
    assert metrics.choice_chance(items) == {"bcq": 0.75, "mcq": 0.2}
    assert metrics.choice_chance(items[4:6]) == {"mcq": 0.5}
