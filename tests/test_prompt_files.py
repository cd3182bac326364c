"""A user's prompt file: every malformed case is one ConfigError line naming file, row and column."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from self_improve.errors import ConfigError
from self_improve.tasks.prompt_files import load_prompt_file
from self_improve.tasks.rewrites import (
    REWRITE_TEMPLATE,
    filter_rewrites,
    near_any,
    render_rewrite_prompt,
)

ROOT = Path(__file__).resolve().parents[1]


def jl(*rows: Any) -> bytes:
    """JSONL bytes: dicts are dumped, str lines are written as they are."""
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


def write(path: Path, content: bytes | pd.DataFrame | None) -> Path:
    if isinstance(content, pd.DataFrame):
        content.to_parquet(path, index=False)
    elif content is not None:
        path.write_bytes(content)
    return path


OK = {"prompt": "fine"}

# (id, file name, content: bytes | parquet frame | None for no file, fragments the message must contain)
MALFORMED = [
    ("invalid_json", "x.jsonl", jl(OK, '{"prompt": "a",'), ["row 2", "not valid JSON"]),
    ("not_object", "x.jsonl", jl(OK, '["a list"]'), ["row 2", "not a JSON object"]),
    ("bad_utf8", "x.jsonl", jl(OK) + b'{"prompt": "caf\xe9"}\n', ["row 2", "UTF-8"]),
    ("prompt_missing_in_row", "x.jsonl", jl(OK, {"answer": "1"}), ["row 2", "column 'prompt'", "missing"]),
    ("prompt_null", "x.jsonl", jl({"prompt": None}), ["row 1", "column 'prompt'", "null"]),
    ("prompt_number", "x.jsonl", jl(OK, OK | {"prompt": 3}), ["row 2", "column 'prompt'", "got int"]),
    ("prompt_list", "x.jsonl", jl({"prompt": ["a"]}), ["row 1", "column 'prompt'", "got list"]),
    ("answer_list", "x.jsonl", jl({"prompt": "a", "answer": [1]}), ["row 1", "column 'answer'", "got list"]),
    ("answer_dict", "x.jsonl", jl({"prompt": "a", "answer": {"v": 1}}), ["row 1", "column 'answer'"]),
    ("answer_bool", "x.jsonl", jl({"prompt": "a", "answer": True}), ["row 1", "column 'answer'", "bool"]),
    ("category_int", "x.jsonl", jl({"prompt": "a", "category": 2}), ["row 1", "column 'category'"]),
    ("empty_prompt", "x.jsonl", jl(OK, {"prompt": "other"}, {"prompt": ""}),
     ["row 3", "column 'prompt'", "empty prompt"]),
    ("blank_prompt", "x.jsonl", jl({"prompt": " \n\t "}), ["row 1", "column 'prompt'", "empty prompt"]),
    ("blank_lines_keep_numbers", "x.jsonl", jl(OK, "", "  ", {"prompt": ""}), ["row 4", "empty prompt"]),
    ("too_long", "x.jsonl", jl({"prompt": "x" * 2001}),
     ["row 1", "column 'prompt'", "2001", "max_chars=2000"]),
    ("control_char", "x.jsonl", jl({"prompt": "ring\u0007"}), ["row 1", "column 'prompt'", "control"]),
    ("carriage_return", "x.jsonl", jl({"prompt": "a\r\nb"}), ["row 1", "column 'prompt'", "control"]),
    ("duplicate", "x.jsonl", jl({"prompt": "a"}, {"prompt": "b"}, {"prompt": "a"}),
     ["row 3", "column 'prompt'", "duplicate of row 1"]),
    ("unknown_column_jsonl", "x.jsonl", jl(OK, OK | {"extra": 1}),
     ["row 2", "column 'extra'", "unknown column"]),
    ("no_prompt_column_jsonl", "x.jsonl", jl({"answer": "1"}, {"answer": "2"}), ["'prompt'"]),
    ("empty_file", "x.jsonl", b"", ["empty file"]),
    ("only_blank_lines", "x.jsonl", b"\n  \n\n", ["empty file"]),
    ("missing_file", "nope.jsonl", None, ["no such file"]),
    ("unknown_extension", "x.csv", b"prompt\na\n", ["unknown extension", ".csv"]),
    ("bad_parquet", "x.parquet", b"PAR1 this is not parquet", ["cannot read parquet"]),
    ("no_prompt_column_parquet", "x.parquet", pd.DataFrame({"answer": ["1"]}), ["column 'prompt'"]),
    ("unknown_column_parquet", "x.parquet", pd.DataFrame({"prompt": ["a"], "note": ["b"]}),
     ["column 'note'", "unknown column"]),
    ("prompt_int_parquet", "x.parquet", pd.DataFrame({"prompt": [1, 2]}),
     ["row 1", "column 'prompt'", "got int"]),
    ("empty_prompt_parquet", "x.parquet", pd.DataFrame({"prompt": ["a", "b", "  "]}),
     ["row 3", "column 'prompt'", "empty prompt"]),
    ("zero_rows_parquet", "x.parquet", pd.DataFrame({"prompt": pd.Series([], dtype=object)}), ["no rows"]),
]


@pytest.mark.parametrize("name,content,fragments", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_file_raises_one_line_naming_file_row_column(tmp_path, name, content, fragments):
    path = write(tmp_path / name, content)
    with pytest.raises(ConfigError) as info:
        load_prompt_file(path)
    msg = str(info.value)
    assert msg.startswith(str(path) + ":"), msg
    assert "\n" not in msg
    for fragment in fragments:
        assert fragment in msg, (fragment, msg)


def test_skip_mode_counts_bad_rows_and_keeps_order(tmp_path):
    path = write(tmp_path / "x.jsonl", jl(
        {"prompt": "first", "category": "a"},
        {"prompt": ""},
        "not json",
        {"prompt": "  "},
        {"prompt": "first"},
        {"prompt": " second ", "answer": 7},
        {"prompt": 5},
    ))
    df, skipped = load_prompt_file(path, on_error="skip")
    assert skipped == {"duplicate": 1, "empty": 2, "invalid_json": 1, "wrong_type": 1}
    assert df["prompt"].tolist() == ["first", " second "]  # kept as given, not stripped
    assert df["answer"].tolist() == [None, "7"]
    assert df["category"].tolist() == ["a", None]


def test_skip_mode_still_raises_for_file_level_problems(tmp_path):
    only_bad = write(tmp_path / "bad.jsonl", jl({"prompt": ""}, {"prompt": None}))
    with pytest.raises(ConfigError, match="no usable rows left"):
        load_prompt_file(only_bad, on_error="skip")
    unknown = write(tmp_path / "unk.jsonl", jl({"prompt": "a", "x": 1}))
    with pytest.raises(ConfigError, match="row 1, column 'x'"):
        load_prompt_file(unknown, on_error="skip")
    with pytest.raises(ConfigError, match="on_error"):
        load_prompt_file(only_bad, on_error="ignore")


def test_duplicate_of_a_skipped_row_is_not_a_duplicate(tmp_path):
    path = write(tmp_path / "x.jsonl", jl({"prompt": "a", "answer": [1]}, {"prompt": "a", "answer": "1"}))
    df, skipped = load_prompt_file(path, on_error="skip")
    assert skipped == {"wrong_type": 1}
    assert df["answer"].tolist() == ["1"]


def test_max_chars_is_configurable(tmp_path):
    path = write(tmp_path / "x.jsonl", jl({"prompt": "abcd"}, {"prompt": "abcdef"}))
    with pytest.raises(ConfigError, match="row 2, column 'prompt'"):
        load_prompt_file(path, max_chars=5)
    df, skipped = load_prompt_file(path, max_chars=5, on_error="skip")
    assert df["prompt"].tolist() == ["abcd"] and skipped == {"too_long": 1}


def test_valid_jsonl_loads(tmp_path):
    path = write(tmp_path / "x.jsonl", b"\xef\xbb\xbf" + jl(
        {"prompt": "What is {x}?\n\tThink.", "answer": 12, "category": "math"},
        "",
        {"prompt": "Say hi", "answer": None},
        {"prompt": "Half", "answer": 2.5},
        {"prompt": "caf\u00e9", "answer": "yes"},
    ))
    df, skipped = load_prompt_file(path)
    assert skipped == {}
    assert list(df.columns) == ["prompt", "answer", "category"]
    assert df["prompt"].tolist() == ["What is {x}?\n\tThink.", "Say hi", "Half", "caf\u00e9"]
    assert df["answer"].tolist() == ["12", None, "2.5", "yes"]
    assert df["category"].tolist() == ["math", None, None, None]


def test_valid_parquet_loads_with_numeric_answers(tmp_path):
    frame = pd.DataFrame({"prompt": ["a", "b", "c"], "answer": [12, None, 3], "category": ["x", None, "y"]})
    path = write(tmp_path / "x.parquet", frame)  # pandas stores the answers as float 12.0, null, 3.0
    df, skipped = load_prompt_file(path)
    assert skipped == {}
    assert df["prompt"].tolist() == ["a", "b", "c"]
    assert df["answer"].tolist() == ["12", None, "3"]
    assert df["category"].tolist() == ["x", None, "y"]
    ints = write(tmp_path / "ints.parquet", pd.DataFrame({"prompt": ["a"], "answer": [12]}))
    assert load_prompt_file(ints)[0]["answer"].tolist() == ["12"]


def test_repo_instructions_file_loads():
    path = ROOT / "data" / "inputs" / "instructions.jsonl"
    df, skipped = load_prompt_file(path)
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    assert skipped == {} and len(df) == len(lines) == 41
    assert df["prompt"].iloc[0] == json.loads(lines[0])["prompt"]
    assert df["answer"].isna().all()
    assert set(df["category"]) <= {"explain", "list", "rewrite", "howto", "synonym"}
    assert len(set(df["category"])) >= 4
    assert all(p.isascii() and len(p) < 200 for p in df["prompt"])
    assert path.read_bytes().isascii()


def test_rewrite_template_is_printable_ascii_and_renders_verbatim():
    template = REWRITE_TEMPLATE.read_text()
    assert set(template) <= set(string.printable) - set("\r\x0b\x0c")
    assert template.count("{prompt}") == 1
    assert template.splitlines()[-1] == "New instruction:"
    assert template.endswith("New instruction:")  # the model's continuation is the rewrite
    user = "Use {braces}, {0} and {prompt} as written."
    out = render_rewrite_prompt(template, user)
    assert user in out and out.count("{prompt}") == 1  # only the one from the user's text
    with pytest.raises(ConfigError, match="placeholder"):
        render_rewrite_prompt("no placeholder", user)


def test_near_any_is_character_trigram_jaccard_overlap():
    assert near_any(["Hello world"], ["hello   WORLD"], max_overlap=0.99) == [True]  # case and spaces folded
    assert near_any(["abc"], ["xyz"], max_overlap=0.0) == [False]
    # {abc, bcd} vs {abc, bce}: 1/3
    assert near_any(["abcd"], ["abce"], max_overlap=0.33) == [True]
    assert near_any(["abcd"], ["abce"], max_overlap=0.34) == [False]
    assert near_any(["ab"], ["ab"], max_overlap=0.99) == [True]  # shorter than n: the text is its own n-gram
    assert near_any(["", "abc"], [""], max_overlap=0.99) == [True, False]  # two empty texts overlap fully


def test_filter_rewrites_drops_empty_long_and_near_duplicates():
    existing = ["List three fruits that are red."]
    candidates = [
        "  Name three birds that cannot fly.  ",
        "",
        "   \n",
        "list three fruits that are  RED.",  # the existing prompt, case and spaces changed
        "Name three birds that can not fly.",  # a near copy of the first kept candidate
        "x" * 81,
        "Explain why leaves turn brown in autumn.",
    ]
    kept, dropped = filter_rewrites(candidates, existing, max_chars=80)
    assert kept == ["Name three birds that cannot fly.", "Explain why leaves turn brown in autumn."]
    assert dropped == {"empty": 2, "near_duplicate": 2, "too_long": 1}


def test_filter_rewrites_threshold_and_no_drops():
    kept, dropped = filter_rewrites(["abce"], ["abcd"], max_chars=10, max_overlap=0.5)
    assert kept == ["abce"] and dropped == {}  # overlap 1/3 is not above 0.5
    kept, dropped = filter_rewrites(["abce"], ["abcd"], max_chars=10, max_overlap=0.3)
    assert kept == [] and dropped == {"near_duplicate": 1}
