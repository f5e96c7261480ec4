"""The one home of the project's patterns (patterns.py): fullmatch, never a trailing newline."""

from __future__ import annotations

import pytest

from dspark_convert.util import patterns
from dspark_convert.source.hub.spec import looks_like_hub_spec, parse_pins, parse_spec
from dspark_convert.errors import HubSpecError
from dspark_convert.target.model import parse_hub_spec
from support.cli import assert_one_error_line, dspark

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHA = "ab" * 32


@pytest.mark.parametrize(("check", "good"), [(patterns.is_commit, COMMIT),
                                              (patterns.is_sha256, SHA),
                                              (patterns.is_repo_id, "org/name")])
def test_a_final_newline_or_space_never_matches(check, good):
    assert check(good)
    for bad in (good + "\n", good + " ", "\n" + good, good.upper() if good != "org/name" else "org/"):
        assert not check(bad), repr(bad)
    assert not check(None) and not check(123)


def test_hub_specs_with_a_trailing_newline_are_not_commits():
    assert parse_hub_spec(f"org/name@{COMMIT}") == ("org/name", COMMIT)
    assert parse_hub_spec(f"org/name@{COMMIT}\n") is None
    with pytest.raises(HubSpecError, match="is not a commit, branch or tag name"):
        parse_spec(f"org/name@{COMMIT}\n")
    # A pin's hash is trimmed of surrounding white space (a shell-pasted value), not inside.
    assert parse_pins([f"model.safetensors={SHA}\n "]) == {"model.safetensors": SHA}


@pytest.mark.parametrize("revision", ["main", "v1.0", "v1.0+cu118", "refs/pr/1", "release_2",
                                      COMMIT, COMMIT.upper()])
def test_revisions_a_hub_can_name_are_read(revision):
    assert patterns.is_revision(revision)
    assert parse_spec(f"org/name@{revision}").revision == (
        revision.lower() if revision.upper() == COMMIT.upper() else revision)


@pytest.mark.parametrize("revision", [COMMIT + "\n", "main ", "a b", "v1\t", "x\x1b[2K", "a~1",
                                      "a^", "a:b", "a?", "a*", "a[0]", "a\\b"])
def test_text_no_branch_or_tag_can_hold_is_refused(revision):
    assert not patterns.is_revision(revision)
    with pytest.raises(HubSpecError, match="is not a commit, branch or tag name"):
        parse_spec(f"org/name@{revision}")


def test_pins_with_a_newline_inside_are_refused():
    with pytest.raises(HubSpecError):
        parse_pins([f"model.safetensors={SHA[:32]}\n{SHA[32:]}"])


def test_convert_refuses_a_spec_with_a_final_newline(tmp_path):
    """It used to be taken as a pinned commit and fail later with exit 1."""
    spec = f"org/name@{COMMIT}\n"
    assert looks_like_hub_spec(spec)
    proc = dspark("convert", spec, "-o", str(tmp_path / "art"), env={"HF_HUB_OFFLINE": "1",
                                                                     "HF_HOME": str(tmp_path / "hf"),
                                                                     "PATH": "/usr/bin:/bin"})
    line = assert_one_error_line(proc, HubSpecError.exit_code, "is not a commit, branch or tag name")
    assert f"org/name@{COMMIT}\\x0a:" in line    # the newline shown escaped, not as a space
    assert not (tmp_path / "art").exists()
