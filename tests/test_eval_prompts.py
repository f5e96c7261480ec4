"""evaluation/prompts.py: the JSONL prompt set, strict, bad lines refused with their number."""

from __future__ import annotations

import hashlib
import json

import pytest

from support.paths import GOLDEN_TARGET as TARGET, REFERENCE_TRACE as REFERENCE
from dspark_convert.errors import PromptSetError
from dspark_convert.evaluation import prompts as prompt_module
from dspark_convert.evaluation.prompts import DEFAULT_PROMPTS, load_prompt_set, resolve_prompts
from dspark_convert.target.tokenizer import fingerprint_tokenizer

# The target's tokenizer as the opened target carries it (target/tokenizer.py).
TOKENIZER = fingerprint_tokenizer(TARGET / "tokenizer.json")


def _write(tmp_path, text: str | bytes, name="prompts.jsonl"):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_default_set_ships_with_the_package_and_runs_on_the_golden_target():
    ps = load_prompt_set()
    assert ps.path == DEFAULT_PROMPTS and ps.info().default
    assert ps.sha256 == hashlib.sha256(DEFAULT_PROMPTS.read_bytes()).hexdigest()
    prompts = resolve_prompts(ps, tokenizer=TOKENIZER, vocab_size=512, context=512)
    assert len(prompts) == len(ps.records) >= 12
    assert len({p.key for p in prompts}) == len(prompts)
    # The two DeepSpec reference prompts are in it, unchanged, so that eval and smoke
    # --reference see the same inputs.
    ref_prompts = json.loads(REFERENCE.read_text())["prompts"]
    assert [list(p.ids) for p in prompts[:2]] == ref_prompts
    # Text prompts go through the target's tokenizer; no prompt holds the drafter's mask
    # token (500) or the stop token (2).
    text = [p for p in prompts if p.category == "text"]
    assert text and all(len(p.ids) > 5 for p in text)
    for p in prompts:
        assert all(0 <= t < 512 for t in p.ids) and 500 not in p.ids and 2 not in p.ids


def test_default_set_is_package_data():
    import tomllib

    from conftest import ROOT

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = cfg["tool"]["setuptools"]["package-data"]
    assert any("data/*.jsonl" in pattern for pattern in data.get("dspark_convert.evaluation", []))


def test_both_forms_ids_and_categories(tmp_path):
    path = _write(tmp_path, '{"id": "a", "prompt_ids": [1, 2, 3], "category": "x"}\n'
                            '{"id": 7, "prompt": "hello world"}')       # no final newline
    ps = load_prompt_set(path)
    assert [r.key for r in ps.records] == ["a", "7"]
    assert ps.lines == (1, 2)
    assert ps.info().categories == {"x": 1, "": 1}
    prompts = resolve_prompts(ps, tokenizer=TOKENIZER, vocab_size=512, context=512)
    from tokenizers import Tokenizer

    want = Tokenizer.from_file(str(TARGET / "tokenizer.json")).encode("hello world").ids
    assert list(prompts[1].ids) == want


@pytest.mark.parametrize("lines, line_no, words", [
    (['{"id": "a", "prompt_ids": [1]}', '{"id": "b", "prompt_ids": [1], "extra": 1}'], 2, "unknown key"),
    (['{"id": "a", "prompt_ids": ["1"]}'], 1, "prompt_ids"),
    (['{"id": "a", "prompt_ids": [1.0]}'], 1, "prompt_ids"),
    (['{"id": "a", "prompt_ids": [true]}'], 1, "prompt_ids"),
    (['{"id": "a", "prompt_ids": [-1]}'], 1, "negative"),
    (['{"id": "a", "prompt_ids": []}'], 1, "prompt_ids"),
    (['{"id": "a", "prompt": ""}'], 1, "prompt"),
    (['{"id": "a", "prompt": "x", "prompt_ids": [1]}'], 1, "exactly one"),
    (['{"id": "a"}'], 1, "exactly one"),
    (['{"prompt": "x"}'], 1, "id"),
    (['{"id": true, "prompt": "x"}'], 1, "id"),
    (['{"id": "", "prompt": "x"}'], 1, "empty"),
    (['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'], 2, "repeats line 1"),
    (['{"id": "a", "prompt": "x"}', '{"id": "a", "id": "b", "prompt": "y"}'], 2, "duplicate key"),
    (['{"id": "a", "prompt": "x"}', '', '{"id": "b", "prompt": "y"}'], 2, "blank line"),
    (['{"id": "a", "prompt": "x"}', '[1, 2]'], 2, "JSON object"),
    (['{"id": "a", "prompt": "x"', ], 1, "not valid JSON"),
    (['{"id": "a", "prompt_ids": [NaN]}'], 1, "not valid JSON"),
    (['{"id": "a", "prompt": "x", "category": 3}'], 1, "category"),
])
def test_bad_line_is_refused_with_its_number(tmp_path, lines, line_no, words):
    path = _write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(PromptSetError) as info:
        load_prompt_set(path)
    msg = info.value.message
    assert f"line {line_no}:" in msg and words in msg, msg
    assert "\n" not in msg and info.value.exit_code == 90


def test_file_level_refusals(tmp_path):
    for text, words in (("", "no prompt"), (b"\xef\xbb\xbf" + b'{"id": 1, "prompt": "x"}\n', "byte-order"),
                        (b'{"id": 1, "prompt": "\xff"}\n', "not UTF-8")):
        with pytest.raises(PromptSetError, match=words):
            load_prompt_set(_write(tmp_path, text))
    with pytest.raises(PromptSetError, match="not found"):
        load_prompt_set(tmp_path / "missing.jsonl")
    with pytest.raises(PromptSetError, match="is a directory, not a regular file"):
        load_prompt_set(tmp_path)


def test_control_characters_in_an_id_are_escaped(tmp_path):
    path = _write(tmp_path, '{"id": "a\\u001b[31m", "prompt": "x"}\n{"id": "a\\u001b[31m", "prompt": "y"}\n')
    with pytest.raises(PromptSetError) as info:
        load_prompt_set(path)
    assert "\x1b" not in info.value.message and "\\x1b" in info.value.message


def test_tokens_are_checked_against_the_target(tmp_path):
    ps = load_prompt_set(_write(tmp_path, '{"id": "a", "prompt_ids": [1]}\n{"id": "b", "prompt_ids": [1, 512]}\n'))
    with pytest.raises(PromptSetError, match=r"line 2: token id 512 is outside the vocabulary 0\.\.511"):
        resolve_prompts(ps, tokenizer=TOKENIZER, vocab_size=512, context=512)
    # Text through the target's tokenizer: its ids, checked against the vocabulary too.
    text = load_prompt_set(_write(tmp_path, '{"id": "a", "prompt": "hi"}\n', name="t.jsonl"))
    ids = TOKENIZER.encode("hi")
    assert [list(p.ids) for p in resolve_prompts(text, tokenizer=TOKENIZER, vocab_size=512, context=512)] == [ids]
    with pytest.raises(PromptSetError, match=rf"line 1: token id {max(ids)} is outside"):
        resolve_prompts(text, tokenizer=TOKENIZER, vocab_size=max(ids), context=512)


def test_prompt_and_new_tokens_must_fit_the_context(tmp_path):
    from dspark_convert.evaluation.prompts import check_context

    ps = load_prompt_set(_write(tmp_path, '{"id": "a", "prompt_ids": [1, 2]}\n{"id": "b", "prompt_ids": [1, 2, 3]}\n'))
    prompts = resolve_prompts(ps, tokenizer=TOKENIZER, vocab_size=512, context=512)
    check_context(prompts, ps, max_new_tokens=7, context=10, config="config.json")
    with pytest.raises(PromptSetError, match=r"line 2: expected prompt \+ --max-new-tokens within "
                                             r"the target's context of 10 positions.*found 3 \+ 8"):
        check_context(prompts, ps, max_new_tokens=8, context=10, config="config.json")


def test_the_sizes_that_bound_a_prompt_sets_memory(tmp_path):
    """File, line and prompt count are refused before a record is built: a file of millions
    of one-token lines was millions of records, several GB."""
    many = _write(tmp_path, '{"id": 1, "prompt_ids": [1]}\n' * (prompt_module.MAX_PROMPTS + 1))
    with pytest.raises(PromptSetError, match=rf"{prompt_module.MAX_PROMPTS + 1} lines; expected "
                                             rf"at most {prompt_module.MAX_PROMPTS} prompts"):
        load_prompt_set(many)
    ids = ",".join(["1"] * (prompt_module.MAX_PROMPT_LINE_BYTES // 2))
    long_line = _write(tmp_path, '{"id": 1, "prompt": "x"}\n{"id": 2, "prompt_ids": [' + ids + ']}\n',
                       name="long.jsonl")
    with pytest.raises(PromptSetError, match=r"line 2: \d+ bytes; expected at most 1048576 bytes a line"):
        load_prompt_set(long_line)
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as fh:
        fh.truncate(prompt_module.MAX_PROMPT_FILE_BYTES + 1)
    with pytest.raises(PromptSetError, match=r"bytes; expected at most 16777216"):
        load_prompt_set(big)


def test_a_text_too_long_for_the_context_is_refused_before_it_is_encoded(tmp_path):
    """512 tokens of at most 9 characters hold 4,608 characters (the golden tokenizer)."""
    assert TOKENIZER.longest_token == 9
    ps = load_prompt_set(_write(tmp_path, json.dumps({"id": 1, "prompt": "ab " * 300_000}) + "\n"))
    with pytest.raises(PromptSetError, match=r"line 1: 900000 characters of text; expected at "
                                             r"most 4608 \(the target's context of 512 tokens"):
        resolve_prompts(ps, tokenizer=TOKENIZER, vocab_size=512, context=512)
    # At the bound it is encoded (and then judged by its tokens, check_context).
    ps = load_prompt_set(_write(tmp_path, json.dumps({"id": 1, "prompt": "a" * 4608}) + "\n",
                                name="edge.jsonl"))
    assert resolve_prompts(ps, tokenizer=TOKENIZER, vocab_size=512, context=512)[0].ids
