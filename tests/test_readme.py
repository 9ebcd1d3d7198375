"""The README's API example runs as written (on the tiny test zoo model, fewer tokens)."""

import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def api_example() -> str:
    text = README.read_text()
    section = text[text.index("## The API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_api_example_runs():
    code = api_example()
    assert "lab.infer.continue_generation" in code and "compress_every" in code
    code = code.replace('"lm-xs"', '"lm-test"')
    code = re.sub(r"max_new_tokens=\d+", "max_new_tokens=4", code)
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    # What the example promises: a continuation of the kept cache, and a registered policy.
    assert scope["out2"].tokens.shape == (1, 4)
    np.testing.assert_array_equal(scope["out"].cache.next_position,
                                  [len(scope["prompts"][0]) + 4])
    assert scope["lab"].infer.policies.get("recent").fn is scope["recent"]
