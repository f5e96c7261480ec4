"""The fingerprint of a target's tokenizer.json, and what kind of token an id is.

A drafter is trained on one tokenizer's ids. The fingerprint (SHA-256 of the file, the
number of tokens, the special tokens, and the ids of a fixed probe string) is recorded in
the manifest so that a later check against another target can tell a different tokenizer
even when its file differs only in ways that do not matter, or matters in ways a size
check would miss. ``classify`` answers whether a token id is one the tokenizer produces
for ordinary text (the mask token must not be).

The ``tokenizers`` library is imported inside the functions: `dspark --help` must not
pay for it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dspark_convert.errors import TargetFormatError, TargetNotFoundError
from dspark_convert.artifact.manifest import SpecialTokenRecord, TokenizerRecord
from dspark_convert.formats.safetensors import json_items

TOKENIZER_FILE = "tokenizer.json"

# Ordinary text of several kinds (words, punctuation, digits, accents, CJK, an emoji):
# two tokenizers that encode it to the same ids very likely agree on ordinary text. Never
# change it: recorded fingerprints hold its ids.
PROBE_TEXT = ("The quick brown fox jumps over the lazy dog; 0123456789, \"quoted\" (x+y)=z? "
              "naïve café, 東京, 😀 and\ta new\nline.")

# The tokenizers library takes about 15 times a vocabulary's JSON in memory to load it (a
# 19 MB file of a million tiny tokens: 280 MB), and the maps kept here as much again, so a
# hostile file is bounded before the library sees it (a 60 MB one took 1.5 GB and 8 s; the
# old 256 MiB cap allowed several GB). The limits are about three times what the tokenizer
# of the family a target must be (Qwen3) needs: 11 MB, 151,669 tokens, 151,387 merges.
MAX_TOKENIZER_BYTES = 32 * 1024 * 1024
# '{', '[' and ',' in the file, counted on the bytes before the library parses them: an upper
# bound on its JSON values, so on the tokens and merges the library builds tables for.
# Qwen3's holds at most about 6 * 10^5 (one per token, up to three per merge).
MAX_TOKENIZER_ITEMS = 2**20
# Tokens (model vocabulary and added tokens), checked once the library has loaded the file
# and before the maps kept here are built.
MAX_TOKENIZER_TOKENS = 2**19

TokenKind = Literal["ordinary", "added", "special", "none"]


@dataclass(frozen=True)
class TokenizerFingerprint:
    """The recorded fingerprint plus the vocabulary needed to classify token ids."""

    record: TokenizerRecord
    # id -> content of the model's own vocabulary (what ordinary text is split into)
    model_vocab: Mapping[int, str] = field(repr=False)
    # id -> (content, special) of the added tokens
    added: Mapping[int, tuple[str, bool]] = field(repr=False)
    # the loaded tokenizers.Tokenizer, for text prompts (smoke --prompt, eval's prompt sets)
    tokenizer: object = field(repr=False, compare=False, default=None)
    # the longest token's content in characters: no token of a byte-level BPE (the Qwen3
    # family's) covers more characters of text, so a text longer than a context times this
    # cannot fit it (target/prompt.py). A tokenizer that folds unknown text of any length
    # into one token (WordPiece's [UNK]) could be refused on a text that would fit.
    longest_token: int = 1

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` as the target's tokenizer gives them (special tokens added
        the way the tokenizer's post-processor adds them, as `tokenizer(text)` does)."""
        return list(self.tokenizer.encode(text).ids)

    def classify(self, token_id: int) -> tuple[TokenKind, str | None]:
        """What the tokenizer makes of ``token_id``: a token of its model vocabulary
        ("ordinary": produced for ordinary text), an added token that is not special
        ("added": produced whenever its text appears, e.g. Qwen3's ``<think>``), a special
        token ("special": only from its literal marker), or none at all ("none")."""
        if token_id in self.added:
            content, special = self.added[token_id]
            return ("special" if special else "added"), content
        if token_id in self.model_vocab:
            return "ordinary", self.model_vocab[token_id]
        return "none", None


def fingerprint_tokenizer(path: str | os.PathLike, *, label: str | None = None) -> TokenizerFingerprint:
    """Read and fingerprint a tokenizer.json. Raises TargetNotFoundError when it cannot be
    read, TargetFormatError when the tokenizers library cannot load it."""
    from tokenizers import Tokenizer

    path = Path(path)
    label = label or str(path)
    data = _read_capped(path, label)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TargetFormatError(f"{label}: not UTF-8 text (byte {exc.start}); expected a "
                                "tokenizer.json", path=label, expected="UTF-8 JSON",
                                found=f"invalid byte at {exc.start}") from None
    _check_items(data, label)
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # the library raises a bare Exception with its parser's text
        reason = " ".join(str(exc).split())[:200]
        raise TargetFormatError(f"{label}: the tokenizers library cannot load it ({reason})",
                                path=label, expected="a tokenizer.json the tokenizers "
                                "library loads", found=reason) from None

    tokens = tokenizer.get_vocab_size(with_added_tokens=True)
    if tokens > MAX_TOKENIZER_TOKENS:
        raise TargetFormatError(f"{label}: the tokenizer has {tokens} tokens; expected at most "
                                f"{MAX_TOKENIZER_TOKENS}", path=label,
                                expected=MAX_TOKENIZER_TOKENS, found=tokens)
    added = {int(i): (tok.content, bool(tok.special))
             for i, tok in tokenizer.get_added_tokens_decoder().items()}
    model_vocab = {i: content for content, i in tokenizer.get_vocab(with_added_tokens=False).items()
                   if i not in added}
    ids = set(model_vocab) | set(added)
    if not ids:
        raise TargetFormatError(f"{label}: the tokenizer has no tokens", path=label,
                                expected="at least one token", found=0)
    probe = tokenizer.encode(PROBE_TEXT, add_special_tokens=False).ids
    record = TokenizerRecord(
        file=TOKENIZER_FILE, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
        vocab_size=len(ids), max_token_id=max(ids),
        special_tokens=[SpecialTokenRecord(id=i, content=added[i][0])
                        for i in sorted(added) if added[i][1]],
        probe_text=PROBE_TEXT, probe_ids=list(probe))
    longest = max(len(s) for s in [*model_vocab.values(), *(c for c, _ in added.values())])
    return TokenizerFingerprint(record=record, model_vocab=model_vocab, added=added,
                                tokenizer=tokenizer, longest_token=max(1, longest))


def _read_capped(path: Path, label: str) -> bytes:
    """The file's bytes, at most MAX_TOKENIZER_BYTES: read up to one byte more than the cap
    (not stat, then read: the file may grow in between)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_TOKENIZER_BYTES + 1)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise TargetNotFoundError(f"{label}: cannot read the target's tokenizer: {reason}",
                                  path=label, expected="a readable tokenizer.json",
                                  found=reason) from None
    if len(data) > MAX_TOKENIZER_BYTES:
        raise TargetFormatError(f"{label}: file is more than {MAX_TOKENIZER_BYTES} bytes; "
                                f"expected at most {MAX_TOKENIZER_BYTES}", path=label,
                                expected=MAX_TOKENIZER_BYTES, found=f"> {MAX_TOKENIZER_BYTES}")
    return data


def _check_items(data: bytes, label: str) -> None:
    """Refuse a tokenizer.json with more than MAX_TOKENIZER_ITEMS JSON values (counted on
    the bytes) before the library parses it: the library's memory grows with them."""
    items = json_items(data, stop_above=MAX_TOKENIZER_ITEMS)
    if items > MAX_TOKENIZER_ITEMS:
        raise TargetFormatError(f"{label}: holds more than {MAX_TOKENIZER_ITEMS} JSON values "
                                f"(counted by the '{{', '[' and ',' before each); expected at "
                                f"most {MAX_TOKENIZER_ITEMS}", path=label,
                                expected=MAX_TOKENIZER_ITEMS, found=f"> {MAX_TOKENIZER_ITEMS}")


def fingerprint_difference(recorded: TokenizerRecord, actual: TokenizerRecord) -> tuple[str, object, object] | None:
    """The first field where two fingerprints differ (field, recorded, actual), or None.

    The file hash comes last: a tokenizer.json re-serialised with the same tokens is
    reported by the first thing that does differ, if anything else does."""
    for name in ("vocab_size", "max_token_id", "special_tokens", "probe_text", "probe_ids",
                 "sha256"):
        want, got = getattr(recorded, name), getattr(actual, name)
        if want != got:
            if name == "special_tokens":
                want = [(t.id, t.content) for t in want]
                got = [(t.id, t.content) for t in got]
            return name, want, got
    return None
