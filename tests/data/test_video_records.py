"""Video-MME and LongVideoBench loaders on fixtures the tests write: fields, frame folders,
subtitles, and errors that name the file, the record and the field."""

import json
import re

import datasets
import numpy as np
import pytest
from PIL import Image

from lab.data.video_records import (
    frame_paths,
    load_frames,
    load_longvideobench,
    load_subtitles,
    load_videomme,
    uniform_indices,
)

VMME = [
    {"video_id": "001", "duration": "short", "domain": "Knowledge", "sub_category": "Humanity",
     "url": "https://www.youtube.com/watch?v=abc", "videoID": "abcYT", "question_id": "001-1",
     "task_type": "Counting Problem", "question": "How many birds?",
     "options": ["A. 1.", "B. 2.", "C. 3.", "D. 4."], "answer": "C"},
    {"video_id": "001", "duration": "short", "domain": "Knowledge", "sub_category": "Humanity",
     "url": "https://www.youtube.com/watch?v=abc", "videoID": "abcYT", "question_id": "001-2",
     "task_type": "Action Recognition", "question": "What does the man do?",
     "options": ["A. Runs.", "B. Sits.", "C. Jumps.", "D. Sleeps."], "answer": "A"},
    {"video_id": "002", "duration": "long", "domain": "Sports", "sub_category": "Football",
     "question_id": "002-1", "task_type": "Temporal Reasoning", "question": "Who scored first?",
     "options": ["A. Red team.", "B. Blue team.", "C. Nobody.", "D. Both."], "answer": "D"},
]


def write_frames(folder, n, shape=(6, 8, 3), ext=".npy"):
    folder.mkdir(parents=True)
    for i in range(n):               # frame_1 .. frame_n: a lexicographic sort would misorder
        arr = np.full(shape, i, np.uint8)
        if ext == ".npy":
            np.save(folder / f"frame_{i + 1}.npy", arr)
        else:
            Image.fromarray(arr).save(folder / f"frame_{i + 1}{ext}")


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def vmme(tmp_path):
    write_frames(tmp_path / "frames" / "abcYT", 12)      # by videoID
    write_frames(tmp_path / "frames" / "002", 3, ext=".png")  # by video_id
    path = tmp_path / "videomme.jsonl"
    write_jsonl(path, VMME)
    return tmp_path, path


def test_videomme_loads_records_and_frame_folders(vmme):
    root, path = vmme
    ds = load_videomme(str(path), str(root / "frames"))
    assert len(ds) == 3 and set(ds["task"]) == {"videomme"}
    assert ds["options"][0] == ["1.", "2.", "3.", "4."]
    assert ds["answer"] == ["C", "A", "D"] and ds["answer_index"] == [2, 0, 3]
    assert ds["difficulty"] == [0, 0, 2] and ds["question_type"][2] == "Temporal Reasoning"
    assert ds["prompt"][0] == "How many birds?\nA. 1.\nB. 2.\nC. 3.\nD. 4.\n"
    assert ds["n_frames"] == [12, 12, 3] and ds["video_key"] == ["abcYT", "abcYT", "002"]
    names = [p.rsplit("/", 1)[1] for p in ds["frame_paths"][0]]
    assert names[:3] == ["frame_1.npy", "frame_2.npy", "frame_3.npy"] and names[-1] == \
        "frame_12.npy"
    idx = uniform_indices(ds["n_frames"][0], 4)
    np.testing.assert_array_equal(idx, [1, 4, 7, 10])
    frames = load_frames(ds["frame_paths"][0], idx)
    assert frames.shape == (4, 6, 8, 3) and frames.dtype == np.uint8
    np.testing.assert_array_equal(frames[:, 0, 0, 0], idx)   # frame i holds value i
    np.testing.assert_array_equal(load_frames(ds["frame_paths"][2])[:, 0, 0, 0], [0, 1, 2])
    plain = load_videomme(str(path))                          # records only
    assert plain["n_frames"] == [0, 0, 0] and plain["answer"] == ds["answer"]


def test_videomme_reads_parquet_and_json(vmme, tmp_path):
    root, path = vmme
    pq = tmp_path / "test-00000-of-00001.parquet"
    rows = [{**r, "videoID": r.get("videoID", ""), "url": r.get("url", "")} for r in VMME]
    datasets.Dataset.from_list(rows).to_parquet(str(pq))
    js = tmp_path / "videomme.json"
    js.write_text(json.dumps(VMME))
    a = load_videomme(str(pq), str(root / "frames"))
    b = load_videomme(str(js), str(root / "frames"))
    assert a["options"] == b["options"] and a["n_frames"] == b["n_frames"] == [12, 12, 3]


@pytest.mark.parametrize("change,message", [
    ({"task_type": None}, r"missing field 'task_type'"),
    ({"options": ["A. only"]}, r"field 'options'=\['A. only'\]; expected at least 2 options"),
    ({"answer": "E"}, r"field 'answer'='E'; expected a letter in A..D"),
    ({"duration": "huge"}, r"field 'duration'='huge'; expected one of \('short'"),
    ({"question": ""}, r"field 'question'=''; expected a non-empty string"),
    ({"videoID": "zzz"}, r"field 'videoID'='zzz'; expected a frame folder \(tried .*zzz"),
])
def test_videomme_errors_name_file_record_and_field(vmme, change, message):
    root, path = vmme
    bad = dict(VMME[1])
    for k, v in change.items():
        if v is None:
            bad.pop(k)
        else:
            bad[k] = v
    write_jsonl(path, [VMME[0], bad])
    where = re.escape(f"{path}: record 1 (question_id='001-2'): ")
    with pytest.raises(ValueError, match=where + message):
        load_videomme(str(path), str(root / "frames"))


LVB = [
    {"id": "86CxyhFV9MI_0", "video_id": "86CxyhFV9MI", "question": "What is on the table?",
     "candidates": ["a cup", "a book", "a phone"], "correct_choice": 1, "duration": 12.5,
     "duration_group": 15, "question_category": "S2O", "subtitle_path": "86CxyhFV9MI_en.json",
     "starting_timestamp_for_subtitles": 10.0, "video_path": "86CxyhFV9MI.mp4"},
    {"id": "xYz_1", "video_id": "xYz", "question": "Which comes after the dog?",
     "candidates": ["cat", "bird", "fish", "horse", "cow"], "correct_choice": 4,
     "duration": 1200.0, "question_category": "E3E", "subtitle_path": "xYz_en.json",
     "starting_timestamp_for_subtitles": 0.0, "video_path": "xYz.mp4"},
    {"id": "test_0", "video_id": "xYz", "question": "Unknown answer?",   # test split: no key
     "candidates": ["yes", "no"], "duration": 1200.0, "subtitle_path": "xYz_en.json",
     "starting_timestamp_for_subtitles": 0.0},
]


@pytest.fixture
def lvb(tmp_path):
    write_frames(tmp_path / "frames" / "86CxyhFV9MI", 5)
    write_frames(tmp_path / "frames" / "xYz", 8, ext=".jpg")
    subs = tmp_path / "subtitles"
    subs.mkdir()
    (subs / "86CxyhFV9MI_en.json").write_text(json.dumps([
        {"timestamp": [11.0, 12.5], "text": "hello"}, {"timestamp": [13.0, None], "text": "end"}]))
    (subs / "xYz_en.json").write_text(json.dumps([
        {"start": "00:00:01.500", "end": "00:01:02.000", "line": "first line"}]))
    path = tmp_path / "lvb_val.json"
    path.write_text(json.dumps(LVB))
    return tmp_path, path


def test_longvideobench_loads_records_frames_and_subtitles(lvb):
    root, path = lvb
    ds = load_longvideobench(str(path), str(root / "frames"), str(root / "subtitles"))
    assert ds["answer"] == ["B", "E", ""] and ds["answer_index"] == [1, 4, -1]
    assert ds["options"][1] == ["cat", "bird", "fish", "horse", "cow"]
    assert ds["prompt"][0] == "What is on the table?\nA. a cup\nB. a book\nC. a phone\n"
    assert ds["difficulty"] == [0, 3, 3] and ds["question_type"] == ["S2O", "E3E", ""]
    assert ds["n_frames"] == [5, 8, 8] and set(ds["task"]) == {"longvideobench"}
    # the reference loader's reading: times minus starting_timestamp_for_subtitles, an open
    # end at the video's duration
    assert ds["subtitles"][0] == [{"start": 1.0, "end": 2.5, "text": "hello"},
                                  {"start": 3.0, "end": 2.5, "text": "end"}]
    assert ds["subtitles"][1] == [{"start": 1.5, "end": 62.0, "text": "first line"}]
    jpg = load_frames(ds["frame_paths"][1], [0, 7])
    assert jpg.shape == (2, 6, 8, 3)
    assert abs(int(jpg[1].mean()) - 7) <= 1                  # JPEG: close to the value 7
    bare = load_longvideobench(str(path))
    assert bare["subtitles"] == [[], [], []] and bare["n_frames"] == [0, 0, 0]


@pytest.mark.parametrize("change,message", [
    ({"candidates": ["only"]}, r"field 'candidates'=\['only'\]; expected at least 2 options"),
    ({"correct_choice": 5}, r"field 'correct_choice'=5; expected an int in \[0, 5\)"),
    ({"duration": -3}, r"field 'duration'=-3; expected a positive number of seconds"),
    ({"video_id": None}, r"missing field 'video_id'"),
    ({"subtitle_path": "nope.json"}, r"subtitle file '.*nope.json' does not exist"),
])
def test_longvideobench_errors_name_file_record_and_field(lvb, change, message):
    root, path = lvb
    bad = dict(LVB[1])
    for k, v in change.items():
        if v is None:
            bad.pop(k)
        else:
            bad[k] = v
    path.write_text(json.dumps([LVB[0], bad]))
    where = "" if "subtitle" in message else re.escape(f"{path}: record 1 (id='xYz_1'): ")
    with pytest.raises(ValueError, match=where + message):
        load_longvideobench(str(path), str(root / "frames"), str(root / "subtitles"))


def test_subtitle_entry_errors_name_the_entry(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps([{"start": "00:00:01.0", "end": "00:00:02.0", "line": "ok"},
                             {"start": "00:00:03.0", "end": "soon", "line": "bad"}]))
    with pytest.raises(ValueError, match=re.escape(f"{p}: entry 1: field 'end'='soon'")):
        load_subtitles(str(p))


def test_load_frames_rejects_wrong_dtype_shape_and_size(tmp_path):
    np.save(tmp_path / "f.npy", np.zeros((4, 4, 3), np.float32))
    np.save(tmp_path / "g.npy", np.zeros((4, 4), np.uint8))
    np.save(tmp_path / "h.npy", np.zeros((4, 4, 3), np.uint8))
    np.save(tmp_path / "i.npy", np.zeros((5, 4, 3), np.uint8))
    with pytest.raises(ValueError, match=r"f.npy' has dtype float32; expected uint8"):
        load_frames([str(tmp_path / "f.npy")])
    with pytest.raises(ValueError, match=r"g.npy' has shape \(4, 4\); expected \[H, W, 3\]"):
        load_frames([str(tmp_path / "g.npy")])
    with pytest.raises(ValueError, match=r"i.npy' has shape \(5, 4, 3\); expected \(4, 4, 3\)"):
        load_frames([str(tmp_path / "h.npy"), str(tmp_path / "i.npy")])
    with pytest.raises(ValueError, match=r"indices \[2\] outside \[0, 1\)"):
        load_frames([str(tmp_path / "h.npy")], [2])
    with pytest.raises(ValueError, match=r"k=0; expected a positive int"):
        uniform_indices(10, 0)
    np.testing.assert_array_equal(uniform_indices(3, 8), [0, 1, 2])
    assert [p.rsplit("/", 1)[1] for p in frame_paths(str(tmp_path))] == [
        "f.npy", "g.npy", "h.npy", "i.npy"]
