"""The one home of the project's text patterns: commits, hashes, Hub repo ids and specs.

Every check goes through ``fullmatch`` (or the ``^...\\Z`` pattern text for pydantic and
JSON Schema): a ``$`` in ``re.match`` also matches before a final newline, which once let
``org/name@<40 hex>\\n`` through as a pinned commit.
"""

from __future__ import annotations

import re

COMMIT_PATTERN = r"^[0-9a-f]{40}$"          # for pydantic Field(pattern=...): its engine
SHA256_PATTERN = r"^[0-9a-f]{64}$"          # (Rust regex) has no trailing-newline match
REPO_PATTERN = r"^[A-Za-z0-9][\w.-]*/[\w.-]+$"

_COMMIT = re.compile(r"[0-9a-f]{40}")
_COMMIT_ANY_CASE = re.compile(r"[0-9a-fA-F]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# A revision: a commit, a branch or a tag. Letters, digits and ``_ . / - +``: no whitespace
# or control character (which git's check-ref-format refuses in a ref name too).
_REVISION_TEXT = r"[\w./+-]+"
_REVISION = re.compile(_REVISION_TEXT)
# org/name@revision
_HUB_SPEC = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)@(?P<rev>" + _REVISION_TEXT + ")")


def is_commit(text: object) -> bool:
    """A 40-hex lowercase git commit."""
    return isinstance(text, str) and _COMMIT.fullmatch(text) is not None


def is_commit_any_case(text: object) -> bool:
    return isinstance(text, str) and _COMMIT_ANY_CASE.fullmatch(text) is not None


def is_sha256(text: object) -> bool:
    """64 lowercase hex digits."""
    return isinstance(text, str) and _SHA256.fullmatch(text) is not None


def is_repo_id(text: object) -> bool:
    """A Hugging Face Hub repo id, org/name."""
    return isinstance(text, str) and _REPO.fullmatch(text) is not None


def is_revision(text: object) -> bool:
    """Text that can name a commit, branch or tag on the Hub (see _REVISION_TEXT)."""
    return isinstance(text, str) and _REVISION.fullmatch(text) is not None


def split_hub_spec(text: str) -> tuple[str, str] | None:
    """(repo, revision) of ``org/name@revision``, or None when ``text`` is not one."""
    match = _HUB_SPEC.fullmatch(text)
    return (match["repo"], match["rev"]) if match else None
