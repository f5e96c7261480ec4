"""What a Hub source is: the ``org/name@<40-hex commit>`` spec, ``--sha256`` pins, and which
of a commit's files a conversion downloads (never a pickle file).

Nothing here talks to the Hub or reads the cache; the patterns themselves live in
util/patterns.py (the one regex home).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable
from dataclasses import dataclass

from dspark_convert.errors import HubSpecError
from dspark_convert.formats.safetensors import (
    INDEX_NAME,
    PICKLE_SUFFIXES,
    SINGLE_WEIGHTS_NAME,
)
from dspark_convert.util.patterns import (
    is_commit,
    is_commit_any_case,
    is_repo_id,
    is_revision,
    is_sha256,
)

# What conversion needs, top-level files only. Tokenizer files are taken when present
# (the target checks fingerprint them).
CHECKPOINT_PATTERNS: tuple[str, ...] = (
    "config.json", "*.safetensors", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json",
)
# Never downloaded, whatever the patterns say: unpickling runs code. The same suffixes the
# local checkpoint reader never opens (formats/safetensors.py).
NEVER_SUFFIXES = PICKLE_SUFFIXES
# A checkpoint has one of these (single-file or sharded weights).
WEIGHTS_FILES = (SINGLE_WEIGHTS_NAME, INDEX_NAME)


@dataclass(frozen=True)
class HubSpec:
    repo: str
    revision: str | None  # as written; None when the spec has no '@'

    @property
    def is_commit(self) -> bool:
        return self.revision is not None and is_commit(self.revision)

    def __str__(self) -> str:
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"


def looks_like_hub_spec(text: str | os.PathLike) -> bool:
    """True for ``org/name@rev`` that is not an existing local path (a local directory
    always wins; ``org/name`` alone is a Hub spec only with --resolve or --lock)."""
    text = os.fspath(text)
    if os.path.exists(text) or "@" not in text:
        return False
    return is_repo_id(text.split("@", 1)[0])


def parse_spec(text: str) -> HubSpec:
    repo, at, revision = text.partition("@")
    if not is_repo_id(repo):
        raise HubSpecError(f"{text}: not a Hub spec; expected org/name@<40-hex commit>",
                           field="source", expected="org/name@<40-hex commit>", found=text)
    if at and not revision:
        raise HubSpecError(f"{text}: empty revision after '@'; expected a 40-hex commit",
                           field="source", expected="org/name@<40-hex commit>", found=text)
    if revision and not is_revision(revision):
        raise HubSpecError(f"{text}: revision {revision!r} is not a commit, branch or tag name "
                           "(letters, digits, '_', '.', '/', '-', '+'); expected "
                           "org/name@<40-hex commit>", field="source",
                           expected="org/name@<40-hex commit>", found=text)
    if revision and is_commit_any_case(revision):
        revision = revision.lower()
    return HubSpec(repo=repo, revision=revision or None)


def parse_pins(texts: Iterable[str]) -> dict[str, str]:
    """``--sha256 FILE=HEX`` options -> {file: hex}; malformed or repeated pins refused."""
    pins: dict[str, str] = {}
    for text in texts:
        path, eq, digest = text.partition("=")
        digest = digest.strip().lower()
        if not eq or not path or not is_sha256(digest):
            raise HubSpecError(f"--sha256 {text}: expected FILE=<64-hex SHA-256>",
                               field="--sha256", expected="FILE=<64-hex SHA-256>", found=text)
        if path in pins and pins[path] != digest:
            raise HubSpecError(f"--sha256 {path}: pinned twice with different hashes",
                               field="--sha256", expected="one hash per file", found=text)
        pins[path] = digest
    return pins


def wanted(path: str, patterns: Iterable[str]) -> bool:
    """Whether a repo file is downloaded: matches a pattern, is never a pickle file, and
    (for patterns without '/') sits at the top level."""
    if path.lower().endswith(NEVER_SUFFIXES):
        return False
    for pattern in patterns:
        if "/" not in pattern and "/" in path:
            continue
        if fnmatch.fnmatchcase(path, pattern):
            return True
    return False
