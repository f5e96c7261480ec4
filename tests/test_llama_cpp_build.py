"""tools/llama_cpp.py, the engine build, and how the tests find it (issue 20).

The build itself runs in `make test` (its `llama-cpp` prerequisite) and the engine tests use
it; these cases are the refusals and the rule that CI never skips an engine test."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support import llama_cpp as support
from support.paths import ROOT

TOOL = ROOT / "tools" / "llama_cpp.py"


def _tool(*args, env_extra, tmp_path):
    import os

    env = {**os.environ, "DSPARK_ENGINE_CACHE": str(tmp_path / "cache"), **env_extra}
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_an_sdist_of_another_sha256_is_refused_and_nothing_is_left(tmp_path):
    fake = tmp_path / support.build.SDIST_NAME
    fake.write_bytes(b"not the pinned sdist")
    proc = _tool("build", env_extra={"DSPARK_LLAMA_CPP_SDIST": str(fake)}, tmp_path=tmp_path)
    assert proc.returncode == 1
    assert "SHA-256" in proc.stderr and support.build.SDIST_SHA256 in proc.stderr
    assert "refusing to build it" in proc.stderr
    assert list((tmp_path / "cache").iterdir()) == []      # no build, no temporary


def test_path_says_how_to_build_when_missing(tmp_path):
    proc = _tool("path", env_extra={}, tmp_path=tmp_path)
    assert proc.returncode == 1 and "make llama-cpp" in proc.stderr


def test_an_incomplete_build_directory_is_not_a_build(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path))
    (support.build.build_dir() / "bin").mkdir(parents=True)
    assert not support.build.is_built()


def test_engine_tests_fail_under_ci_when_the_build_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="make llama-cpp"):
        support.engine()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="make llama-cpp"):
        support.engine()
