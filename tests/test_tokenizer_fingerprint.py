"""tokenizer_fingerprint: the golden target's tokenizer.json and tokenizers made here with
the real ``tokenizers`` library."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
from conftest import GOLDEN, ROOT
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from dspark_convert.errors import TargetFormatError, TargetNotFoundError
from dspark_convert.target.tokenizer import (
    PROBE_TEXT,
    fingerprint_difference,
    fingerprint_tokenizer,
)

GOLDEN_TOKENIZER = GOLDEN / "reference" / "target" / "tokenizer.json"


def word_level(path, words, *, added=(), unk="[UNK]"):
    """A WordLevel tokenizer over ``words`` (ids in order), written to ``path``."""
    vocab = {unk: 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    for content, special in added:
        if special:
            tok.add_special_tokens([AddedToken(content, special=True)])
        else:
            tok.add_tokens([AddedToken(content, special=False)])
    path.write_text(tok.to_str())
    return path


def test_golden_tokenizer_fingerprint():
    fp = fingerprint_tokenizer(GOLDEN_TOKENIZER)
    rec = fp.record
    assert rec.sha256 == hashlib.sha256(GOLDEN_TOKENIZER.read_bytes()).hexdigest()
    assert rec.size == GOLDEN_TOKENIZER.stat().st_size
    assert (rec.vocab_size, rec.max_token_id) == (400, 399)
    assert [(t.id, t.content) for t in rec.special_tokens] == [(0, "<pad>"), (1, "<s>"), (2, "</s>")]
    # The probe ids are what the library itself encodes, and they decode back to the text.
    tok = Tokenizer.from_file(str(GOLDEN_TOKENIZER))
    assert rec.probe_ids == tok.encode(PROBE_TEXT, add_special_tokens=False).ids
    assert tok.decode(rec.probe_ids) == PROBE_TEXT
    assert rec.probe_text == PROBE_TEXT
    # The drafter's mask token 500 is beyond every token; byte tokens are ordinary.
    assert fp.classify(500) == ("none", None)
    assert fp.classify(1) == ("special", "<s>")
    kind, content = fp.classify(rec.probe_ids[0])
    assert kind == "ordinary" and content == tok.id_to_token(rec.probe_ids[0])


def test_golden_tokenizer_is_reproducible():
    # The script's --check rebuilds the file and compares it byte for byte.
    result = subprocess.run([sys.executable, str(GOLDEN / "make_target_fixtures.py"), "--check"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_added_and_special_tokens_are_told_apart(tmp_path):
    path = word_level(tmp_path / "tokenizer.json", ["hello", "world"],
                      added=[("<think>", False), ("<|mask|>", True)])
    fp = fingerprint_tokenizer(path)
    assert fp.classify(1) == ("ordinary", "hello")
    assert fp.classify(3) == ("added", "<think>")
    assert fp.classify(4) == ("special", "<|mask|>")
    assert fp.classify(5) == ("none", None)
    assert [(t.id, t.content) for t in fp.record.special_tokens] == [(4, "<|mask|>")]
    assert fp.record.vocab_size == 5 and fp.record.max_token_id == 4


def test_difference_names_the_first_field(tmp_path):
    a = fingerprint_tokenizer(word_level(tmp_path / "a.json", ["hello", "world"])).record
    b = fingerprint_tokenizer(word_level(tmp_path / "b.json", ["hello", "world", "fox"])).record
    assert fingerprint_difference(a, a) is None
    assert fingerprint_difference(a, b) == ("vocab_size", 3, 4)
    # Same tokens, other bytes: only the file hash tells them apart.
    c_path = tmp_path / "c.json"
    c_path.write_text((tmp_path / "a.json").read_text() + "\n")
    c = fingerprint_tokenizer(c_path).record
    assert fingerprint_difference(a, c) == ("sha256", a.sha256, c.sha256)


def test_missing_and_malformed(tmp_path):
    with pytest.raises(TargetNotFoundError, match="cannot read the target's tokenizer"):
        fingerprint_tokenizer(tmp_path / "tokenizer.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    with pytest.raises(TargetFormatError, match="tokenizers library cannot load it") as info:
        fingerprint_tokenizer(bad)
    assert "\n" not in info.value.message
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(TargetFormatError, match="not UTF-8"):
        fingerprint_tokenizer(binary)
