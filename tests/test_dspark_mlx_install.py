"""tools/dspark_mlx.py, the dspark-mlx install, and how the tests find it.

The install itself runs in `make test` (its `dspark-mlx` prerequisite) and the engine tests
use it. These cases: the cached install is whole and runs the pinned versions; a copy of it
changed in one way is refused in one line naming the path (the copy is made of hard links,
and every edit replaces a file, never writes into one, so the real install is untouched);
a tampered install is replaced by `install`; an interrupted install leaves nothing; a wheel
of another hash is refused by pip; and CI never skips an engine test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import dspark_mlx as support
from support.paths import ROOT

TOOL = ROOT / "tools" / "dspark_mlx.py"
tool = support.tool
SITE = f"venv/lib/python{tool.PYTHON[0]}.{tool.PYTHON[1]}/site-packages"


def _tool(*args, cache: Path, timeout=300, **kw):
    env = {**os.environ, "DSPARK_ENGINE_CACHE": str(cache)}
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def installed() -> Path:
    """The cached install's directory (skipped, or failed under CI, when there is none)."""
    support.engine()
    return tool.install_dir()


def _linked_copy(installed: Path, cache: Path) -> Path:
    """A copy of the whole install made of hard links (fast, no data copied); an edit must
    replace a file, never write into it, or it would change the real install too."""
    root = cache / tool.DIR_NAME
    shutil.copytree(installed, root, symlinks=True, copy_function=os.link)
    return root


def _replace(path: Path, data: bytes) -> None:
    """``path`` replaced by a new file holding ``data`` (its hard link to the real install
    broken, not written through)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_the_cached_install_is_whole_and_runs_the_pinned_versions(installed):
    proc = _tool("path", cache=installed.parent)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{tool.python_path()}\n", "")
    probe = subprocess.run(
        [str(tool.python_path()), "-I", "-c", "import dspark_mlx, mlx.core as mx, importlib.metadata"
         " as m; print(dspark_mlx.__version__, m.version('mlx'), m.version('mlx-cpu'), "
         "mx.default_device())"], capture_output=True, text=True, timeout=120)
    assert probe.stdout.split() == [tool.VERSION, tool.MLX, tool.MLX, "Device(cpu,", "0)"], \
        probe.stderr[-2000:]


def test_the_pins_are_every_distribution_of_the_install_and_the_file_pip_read(installed):
    """requirements.txt is what pip installed from: each pin with its SHA-256; the install
    holds exactly the pinned distributions (check_install's own comparison) and no pip."""
    lines = (installed / tool.REQUIREMENTS_FILE).read_text().splitlines()[1:]
    assert len(lines) == len(tool.PINS)
    assert "dspark-mlx==0.1.0 --hash=sha256:" in lines[[p[0] for p in tool.PINS].index("dspark-mlx")]
    assert f"mlx[cpu]=={tool.MLX} --hash=sha256:" in "\n".join(lines)
    site = installed / SITE
    names = sorted(tool.venvs.normal_name(p.name[: -len(".dist-info")].rpartition("-")[0])
                   for p in site.glob("*.dist-info"))
    assert names == sorted(tool.venvs.normal_name(p[0]) for p in tool.PINS)
    assert not (site / "pip").exists()
    assert sorted(p.name for p in (installed / "venv" / "bin").iterdir()) == [
        "python", "python3", f"python{tool.PYTHON[0]}.{tool.PYTHON[1]}"]


def test_path_says_how_to_install_when_missing(tmp_path):
    proc = _tool("path", cache=tmp_path)
    assert proc.returncode == 1 and "make dspark-mlx" in proc.stderr


def test_engine_tests_fail_under_ci_when_the_install_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="make dspark-mlx"):
        support.engine()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="make dspark-mlx"):
        support.engine()


@pytest.mark.slow
def test_a_whole_install_is_reused_by_install(installed, tmp_path):
    _linked_copy(installed, tmp_path)
    started = time.monotonic()
    proc = _tool("install", cache=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "pip install" not in proc.stdout and str(tmp_path / tool.DIR_NAME) in proc.stdout
    assert time.monotonic() - started < 60


def _info(root: Path, **changes) -> None:
    _replace(root / tool.INFO_FILE, json.dumps({**tool.expected_info(), **changes}).encode())


def _module(root: Path, rel: str) -> Path:
    return root / SITE / rel


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


# Foreign code planted in a copy: were it run (by the interpreter's probe, say) it would leave
# this file beside the install; the check must refuse the copy without running it.
RAN = "foreign-code-ran"


def _foreign(root: Path, rel: str, code: str) -> None:
    (root / SITE / rel).write_text(code.replace("MARKER", repr(str(root.parent / RAN))))


def _symlinked_out(root: Path, package: str) -> None:
    """``package`` moved out of the cache and linked back: the same bytes, another place."""
    outside = root.parent / "outside"
    outside.mkdir()
    (root / SITE / package).rename(outside / package)
    (root / SITE / package).symlink_to(outside / package)


TAMPERED = {
    # name: (edit of a whole install at root, the path named, what the line says, fast?)
    "module_changed": (
        lambda r: _replace(_module(r, "dspark_mlx/loop.py"),
                           _module(r, "dspark_mlx/loop.py").read_bytes() + b"\n# edited\n"),
        f"{SITE}/dspark_mlx/loop.py", "its SHA-256 is not the one dspark_mlx-0.1.0.dist-info's "
        "RECORD lists", True),                  # the fast canary; the rest are slow
    "module_missing": (lambda r: _module(r, "dspark_mlx/verify.py").unlink(),
                       f"{SITE}/dspark_mlx/verify.py", "missing; dspark_mlx-0.1.0.dist-info's "
                       "RECORD lists it", False),
    "module_fifo": (lambda r: _fifo(_module(r, "mlx_lm/generate.py")),
                    f"{SITE}/mlx_lm/generate.py", "a FIFO; expected the regular file", False),
    "extra_distribution": (lambda r: (r / SITE / "evil-1.0.dist-info").mkdir(),
                           f"{SITE}/evil-1.0.dist-info", "evil is installed and not pinned", False),
    "distribution_missing": (lambda r: shutil.rmtree(r / SITE / "mlx_lm-0.32.2.dist-info"),
                             SITE, "no mlx-lm distribution; expected mlx-lm==0.32.2", False),
    "other_version": (lambda r: (r / SITE / "mlx_vlm-0.7.10.dist-info").rename(
        r / SITE / "mlx_vlm-0.7.9.dist-info"), f"{SITE}/mlx_vlm-0.7.9.dist-info",
        "mlx-vlm 0.7.9; expected 0.7.10", False),
    "info_other_version": (lambda r: _info(r, version="0.1.1"), tool.INFO_FILE,
                           'version is "0.1.1", expected "0.1.0"', False),
    "info_other_requirements": (lambda r: _info(r, requirements_sha256="0" * 64), tool.INFO_FILE,
                                "requirements_sha256 is", False),
    "info_extra_key": (lambda r: _info(r, note="x"), tool.INFO_FILE, 'unexpected key "note"',
                       False),
    "info_nan": (lambda r: _replace(r / tool.INFO_FILE, b'{"version": NaN}'), tool.INFO_FILE,
                 "NaN is not JSON", False),
    "info_fifo": (lambda r: _fifo(r / tool.INFO_FILE), tool.INFO_FILE, "a FIFO", False),
    "info_missing": (lambda r: (r / tool.INFO_FILE).unlink(), tool.INFO_FILE, "missing", False),
    "requirements_changed": (
        lambda r: _replace(r / tool.REQUIREMENTS_FILE, (r / tool.REQUIREMENTS_FILE).read_bytes()
                           .replace(tool.PINS[0][2].encode(), b"0" * 64)),
        tool.REQUIREMENTS_FILE, "not the pinned requirements", False),
    "python_missing": (lambda r: (r / "venv/bin/python").unlink(), "venv/bin/python",
                       "not an executable file", False),
    "python_other": (lambda r: ((r / "venv/bin/python").unlink(),
                                (r / "venv/bin/python").symlink_to("/bin/true")),
                     "venv/bin/python", "expected CPython 3.11", False),
    "root_symlink": (lambda r: (r.rename(r.parent / "elsewhere"), r.symlink_to(r.parent / "elsewhere")),
                     "", "a symbolic link; expected the directory", False),
    # Code that would run at the interpreter's start, or a pinned name served from elsewhere.
    "stray_pth": (lambda r: _foreign(r, "zz-evil.pth", "import os; open(MARKER, 'w')\n"),
                  f"{SITE}/zz-evil.pth", "a regular file no pinned distribution's RECORD lists",
                  True),
    "sitecustomize": (lambda r: _foreign(r, "sitecustomize.py", "open(MARKER, 'w')\n"),
                      f"{SITE}/sitecustomize.py", "no pinned distribution's RECORD lists", False),
    "usercustomize": (lambda r: _foreign(r, "usercustomize.py", "open(MARKER, 'w')\n"),
                      f"{SITE}/usercustomize.py", "no pinned distribution's RECORD lists", False),
    "module_added": (lambda r: _foreign(r, "dspark_mlx/extra.py", "open(MARKER, 'w')\n"),
                     f"{SITE}/dspark_mlx/extra.py", "no pinned distribution's RECORD lists",
                     False),
    "package_symlinked_out": (lambda r: _symlinked_out(r, "dspark_mlx"), f"{SITE}/dspark_mlx",
                              "a symbolic link to", False),
    "system_site_packages": (
        lambda r: _replace(r / "venv/pyvenv.cfg", (r / "venv/pyvenv.cfg").read_bytes().replace(
            b"include-system-site-packages = false", b"include-system-site-packages = true")),
        "venv/pyvenv.cfg", "include-system-site-packages is 'true'; expected 'false'", False),
}


@pytest.mark.parametrize("case", [pytest.param(name, marks=() if TAMPERED[name][3] else
                                               pytest.mark.slow) for name in sorted(TAMPERED)])
def test_an_install_that_is_not_whole_is_one_line_naming_the_path(case, installed, tmp_path):
    root = _linked_copy(installed, tmp_path)
    edit, named, says, _ = TAMPERED[case]
    edit(root)
    proc = _tool("path", cache=tmp_path, timeout=60)    # a FIFO is never waited on
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(root / named).rstrip("/") + ":" in lines[0] and says in lines[0], lines[0]
    assert "replaces it" in lines[0]
    assert not (tmp_path / RAN).exists(), "the check ran the code it was to refuse"
    # The real install was not touched through a hard link.
    assert tool.install_problem(installed) is None


@pytest.mark.slow
def test_install_replaces_a_tampered_install(installed, tmp_path):
    root = _linked_copy(installed, tmp_path)
    loop = _module(root, "dspark_mlx/loop.py")
    _replace(loop, b"raise SystemExit('tampered')\n")
    proc = _tool("install", cache=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "pip install" in proc.stdout
    assert tool.install_problem(root) is None
    assert loop.read_bytes() == _module(installed, "dspark_mlx/loop.py").read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == [tool.DIR_NAME]      # no temporary left


def _session_alive(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != b"Z" and int(fields[3]) == sid:
                out.append(int(entry))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_install_leaves_nothing_and_no_pip(tmp_path, signum):
    env = {**os.environ, "DSPARK_ENGINE_CACHE": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(TOOL), "install"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        for line in proc.stdout:
            if "pip install" in line:
                break
        time.sleep(3)                       # pip is resolving, downloading, unpacking
        assert proc.poll() is None
        os.kill(proc.pid, signum)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 128 + signum
    err = proc.stderr.read()
    assert "install interrupted" in err and "nothing was written" in err, err
    assert list(tmp_path.iterdir()) == []
    assert _session_alive(proc.pid) == []   # pip and its children ended with it


@pytest.mark.slow
def test_a_wheel_of_another_sha256_is_refused_by_pip_and_nothing_is_left(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path))
    pins = [(n, v, "0" * 64 if n == "mdurl" else h) for n, v, h in tool.PINS]
    monkeypatch.setattr(tool, "PINS", tuple(pins))
    with pytest.raises(tool.InstallError, match="(?s)pip install --require-hashes.*failed.*"
                       "DO NOT MATCH THE HASHES"):
        tool.install()
    assert list(tmp_path.iterdir()) == []


def test_install_refuses_pins_that_are_not_closed(installed):
    """The check install runs after pip (--no-deps) on the new venv, here on the cached
    install's METADATA: the pins pass; without mdurl, which markdown-it-py requires, they are
    refused in one line naming both; an extra asked of a pin (mlx[cpu]) counts."""
    site = installed / SITE
    tool.venvs.check_closed([site], tool.pin_versions(), tool.requirements())
    without = {n: v for n, v in tool.pin_versions().items() if n != "mdurl"}
    roots = [line for line in tool.requirements() if not line.startswith("mdurl==")]
    with pytest.raises(tool.InstallError) as caught:
        tool.venvs.check_closed([site], without, roots)
    assert str(caught.value).startswith("the pins are not closed: markdown-it-py==4.3.0 "
                                        "requires 'mdurl"), caught.value
    assert "no pin of mdurl" in str(caught.value) and "\n" not in str(caught.value)
    without_cpu = {n: v for n, v in tool.pin_versions().items() if n != "mlx-cpu"}
    roots = [line for line in tool.requirements() if not line.startswith("mlx-cpu==")]
    with pytest.raises(tool.InstallError, match=r"mlx\[cpu\]==0.32.4 requires 'mlx-cpu"):
        tool.venvs.check_closed([site], without_cpu, roots)
