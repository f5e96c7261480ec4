"""tools/speculators.py, speculators' own environment, and how the tests find it.

The install itself runs in `make test` (its `speculators` prerequisite) and the speculators
tests use it. These cases: the cached install is whole and runs the pinned versions, with the
project's torch linked in and not the project's transformers; a copy of it changed in one way
is refused in one line naming the path (the copy is made of hard links, every edit replaces
an entry, never writes into one, so the real install is untouched); a tampered install is
replaced by `install`; and CI never skips a speculators test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import speculators as support
from support.paths import ROOT

TOOL = ROOT / "tools" / "speculators.py"
tool = support.tool
SITE = f"venv/lib/python{tool.PYTHON[0]}.{tool.PYTHON[1]}/site-packages"


@pytest.fixture(scope="module")
def installed() -> Path:
    support.python()
    return tool.install_dir()


def _linked_copy(installed: Path, cache: Path) -> Path:
    root = cache / tool.DIR_NAME
    shutil.copytree(installed, root, symlinks=True, copy_function=os.link)
    return root


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_the_cached_install_runs_the_pinned_versions_with_the_projects_torch(installed):
    got = support.run(
        "import json, speculators, torch, transformers, tokenizers, pydantic\n"
        "from speculators.models.dspark import DSparkDraftModel\n"
        "from speculators.models.dflash import DFlashDraftModel\n"
        "import importlib.metadata as m\n"
        "print(json.dumps({'speculators': m.version('speculators'), 'torch': torch.__version__,"
        " 'torch_file': torch.__file__, 'transformers': transformers.__version__,"
        " 'transformers_file': transformers.__file__, 'tokenizers': tokenizers.__version__}))")
    import torch
    assert got["speculators"] == tool.VERSION == "0.9.0"
    assert got["transformers"] == tool.TRANSFORMERS == "5.19.0"
    assert got["tokenizers"] == "0.23.3"
    assert got["torch"] == torch.__version__            # the project's own, linked in
    assert got["torch_file"].startswith(os.path.abspath(installed / tool.TORCH_SITE) + os.sep)
    assert os.path.realpath(got["torch_file"]) == os.path.realpath(torch.__file__)
    # Not the project's transformers (5.24), which speculators' metadata refuses.
    assert got["transformers_file"].startswith(os.path.abspath(installed / SITE) + os.sep)
    assert tool.install_problem() is None


def _tamper_cases(root: Path) -> list[tuple[str, callable, str]]:
    site = root / SITE
    spec = site / "speculators" / "models" / "dspark" / "core.py"

    def edit_code():
        _replace(spec, spec.read_bytes() + b"\n# changed\n")

    def drop_link():
        (root / tool.TORCH_SITE / "torch").unlink()

    def retarget_link():
        link = root / tool.TORCH_SITE / "sympy"
        link.unlink()
        link.symlink_to(site / "numpy")

    def extra_dist():
        (site / "six-1.17.0.dist-info").mkdir()

    def extra_pth():
        (site / "other.pth").write_text("/tmp\n")

    def edit_pth():
        _replace(site / tool.PTH_FILE, b"/work/main/.venv/lib/python3.11/site-packages\n")

    def edit_info():
        info = root / tool.INFO_FILE
        _replace(info, info.read_bytes().replace(b'"5.19.0"', b'"5.24.0"'))

    def edit_requirements():
        req = root / tool.REQUIREMENTS_FILE
        _replace(req, req.read_bytes().replace(b"transformers==5.19.0", b"transformers==5.24.0"))

    def drop_python():
        (root / "venv" / "bin" / "python").unlink()

    # Code that would run at the interpreter's start (were it run, it would leave RAN).
    def sitecustomize():
        (site / "sitecustomize.py").write_text(f"open({str(root.parent / RAN)!r}, 'w')\n")

    def usercustomize():
        (site / "usercustomize.py").write_text(f"open({str(root.parent / RAN)!r}, 'w')\n")

    def package_linked_out():
        outside = root.parent / "outside"
        outside.mkdir()
        (site / "speculators").rename(outside / "speculators")
        (site / "speculators").symlink_to(outside / "speculators")

    def module_added():
        (site / "speculators" / "extra.py").write_text("x = 1\n")

    return [("a changed speculators module", edit_code, "core.py: its SHA-256 is not the one"),
            ("a missing torch link", drop_link, "torch-site/torch: missing"),
            ("a link to elsewhere", retarget_link, "torch-site/sympy: points to"),
            ("an unpinned distribution", extra_dist, "six is installed and not pinned"),
            ("another .pth file", extra_pth, "other.pth"),
            ("the .pth naming the project's site-packages", edit_pth, "dspark-convert-torch.pth"),
            ("install-info.json edited", edit_info, "install-info.json: transformers is"),
            ("requirements.txt edited", edit_requirements, "requirements.txt: not the pinned"),
            ("no interpreter", drop_python, "venv/bin/python: not an executable"),
            ("a sitecustomize.py", sitecustomize,
             "sitecustomize.py: a regular file no pinned distribution's RECORD lists"),
            ("a usercustomize.py", usercustomize,
             "usercustomize.py: a regular file no pinned distribution's RECORD lists"),
            ("a package linked out of the install", package_linked_out,
             "site-packages/speculators: a symbolic link to"),
            ("a module added to a package", module_added,
             "speculators/extra.py: a regular file no pinned distribution's RECORD lists")]


RAN = "foreign-code-ran"


# Each case checks a whole linked copy (~2 s): the fast loop keeps a changed module, a
# missing torch link and a sitecustomize.py; `make test` runs all thirteen.
@pytest.mark.parametrize("case", [0, 1, 9, *(pytest.param(i, marks=pytest.mark.slow)
                                             for i in (*range(2, 9), *range(10, 13)))])
def test_a_changed_copy_is_refused_in_one_line_naming_the_path(installed, tmp_path, case):
    root = _linked_copy(installed, tmp_path)
    assert tool.install_problem(root) is None
    what, change, expected = _tamper_cases(root)[case]
    change()
    problem = tool.install_problem(root)
    assert problem is not None, what
    assert "\n" not in problem and expected in problem, (what, problem)
    assert not (tmp_path / RAN).exists(), "the check ran the code it was to refuse"
    assert tool.install_problem(installed) is None        # the real install untouched


@pytest.mark.slow
def test_a_tampered_install_is_replaced_by_install(installed, tmp_path):
    root = _linked_copy(installed, tmp_path)
    _tamper_cases(root)[0][1]()
    env = {**os.environ, "DSPARK_ENGINE_CACHE": str(tmp_path)}
    path = subprocess.run([sys.executable, str(TOOL), "path"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert path.returncode == 1 and "replaces it" in path.stderr
    done = subprocess.run([sys.executable, str(TOOL), "install"], capture_output=True,
                          text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert tool.install_problem(root) is None
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temporary left
    assert tool.install_problem(installed) is None


def test_ci_never_skips(monkeypatch, tmp_path):
    """Without an install a speculators test skips, except under CI=true, where it fails."""
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="make speculators"):
        support.python()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="make speculators"):
        support.python()
