"""Closed environments: the project's lock (requirements.lock) and each engine's PINS hold every
distribution their own requirements name, at a version each requirement allows.

pip installs each of them with --no-deps (nothing unpinned can come in from the registry), so
nothing but this check says the set is whole. It is tools/pins_closed.py's, on the installed
distributions' METADATA: the project's .venv (installed from the lock) and the engines'
cached installs (`make dspark-mlx`, `make speculators`). The negative cases drop or change one
pin of a real set and expect the requirement and the pin named, so each check can fail."""

from __future__ import annotations

import hashlib
import re
import sysconfig
from pathlib import Path

import pytest

from support import dspark_mlx, speculators
from support.paths import ROOT
from support.tools import load_tool

closed = load_tool("tools/pins_closed.py", siblings=("engine_cache",))
lock = load_tool("tools/lock.py", siblings=("engine_cache",))

LOCK_LINE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) --hash=sha256:[0-9a-f]{64}")


def _lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.startswith("#"):
            continue
        match = LOCK_LINE.fullmatch(line)
        assert match, f"requirements.lock: {line!r} is not NAME==VERSION --hash=sha256:HEX"
        pins[match.group(1)] = match.group(2)
    return pins


def _requires(found: dict) -> dict[str, list[str]]:
    return {name: requires for name, (_, requires) in found.items()}


@pytest.fixture(scope="module")
def venv_found() -> dict:
    """The project's .venv: every distribution's METADATA (the interpreter running the tests)."""
    return closed.installed([Path(sysconfig.get_paths()["purelib"])])


def test_the_lock_is_of_the_current_pyproject_and_constraints():
    text = (ROOT / "requirements.lock").read_text()
    assert lock.recorded_inputs(text) == lock.inputs_sha256(), \
        "requirements.lock was made from other requirements: run `make lock`"


def test_the_lock_pins_every_distribution_with_its_hash_and_the_cpu_torch():
    pins = _lock_pins()
    assert pins["torch"] == "2.13.0+cpu"
    assert "setuptools" in pins             # make install builds the project without isolation
    assert "pip" not in pins and "dspark-convert" not in pins


def test_the_venv_is_the_lock(venv_found):
    pins = _lock_pins()
    assert closed.installed_not_pinned(pins, venv_found) == []
    missing = sorted(n for n in pins if closed.canonicalize_name(n) not in venv_found)
    assert missing == [], "in the lock, not in .venv: run `make install`"
    extra = sorted(set(venv_found) - {closed.canonicalize_name(n) for n in pins}
                   - {"pip", "dspark-convert"})
    assert extra == [], "in .venv, not in the lock"


def test_the_project_lock_is_closed(venv_found):
    assert closed.open_requirements(_lock_pins(), _requires(venv_found), lock.requirements(),
                                    root_name="dspark-convert[dev]") == []


def test_a_lock_without_a_pin_names_the_requirement_and_the_missing_pin(venv_found):
    pins = {n: v for n, v in _lock_pins().items() if n != "typing_extensions"}
    problems = closed.open_requirements(pins, _requires(venv_found), lock.requirements())
    assert problems and all("no pin of typing-extensions" in p for p in problems), problems
    assert any(p.startswith("pydantic==") and "requires 'typing-extensions" in p
               for p in problems), problems


def test_a_pin_outside_a_requirement_names_both(venv_found):
    pins = {**_lock_pins(), "tokenizers": "0.9.0"}
    found = dict(venv_found)
    problems = closed.open_requirements(pins, _requires(found), lock.requirements(),
                                        root_name="dspark-convert[dev]")
    assert any(p.startswith("dspark-convert[dev] requires 'tokenizers") and
               p.endswith("the pin is tokenizers==0.9.0") for p in problems), problems
    assert any(p.startswith("transformers==") for p in problems), problems


def test_a_requirement_of_an_extra_asked_for_must_be_pinned():
    """mlx[cpu] brings mlx-cpu; mlx alone does not; a marker false here needs no pin."""
    requires = {"mlx": ["mlx-cpu==1.0; extra == 'cpu'", "tomli; python_version < '3.0'"],
                "mlx-cpu": []}
    assert closed.open_requirements({"mlx": "1.0"}, requires, ["mlx==1.0"]) == []
    assert closed.open_requirements({"mlx": "1.0"}, requires, ["mlx[cpu]==1.0"]) == [
        "mlx[cpu]==1.0 requires 'mlx-cpu==1.0; extra == \"cpu\"': no pin of mlx-cpu"]
    assert closed.open_requirements({"mlx": "1.0", "mlx-cpu": "1.0"}, requires,
                                    ["mlx[cpu]==1.0"]) == []


def test_an_omission_must_be_needed_and_a_pin_must_have_metadata():
    requires = {"a": ["b>=1"]}
    assert closed.open_requirements({"a": "1"}, requires, [], omitted=[("a", "b")]) == []
    assert closed.open_requirements({"a": "1"}, {"a": []}, [], omitted=[("a", "b")]) == [
        "a is declared to require b (left out on purpose), and no pin requires it: remove the "
        "omission"]
    assert closed.open_requirements({"a": "1", "b": "2"}, requires, []) == [
        "b==2 is pinned and its METADATA was not found; expected it installed"]


def test_the_dspark_mlx_pins_are_closed():
    dspark_mlx.engine()
    tool = dspark_mlx.tool
    found = closed.installed([tool.venvs.site_packages(tool.install_dir(), tool.PYTHON)])
    pins = tool.pin_versions()
    assert closed.installed_not_pinned(pins, found) == []
    assert closed.open_requirements(pins, _requires(found), tool.requirements()) == []
    # What the registry's transformers 5.25.0 broke: mlx-audio asks for transformers with its
    # chat-template extra; without the pin of what that extra needs the set is open.
    without = {n: v for n, v in pins.items() if n != "jinja2"}
    problems = closed.open_requirements(without, _requires(found), tool.requirements())
    assert any("requires 'jinja2" in p and "no pin of jinja2" in p for p in problems), problems


def test_the_speculators_pins_are_closed_but_for_the_declared_omissions():
    speculators.python()
    tool = speculators.tool
    root = tool.install_dir()
    found = closed.installed([tool.venvs.site_packages(root, tool.PYTHON), root / tool.TORCH_SITE])
    pins = {name: version for name, version, _ in tool.PINS}
    pins.update({name: found[closed.canonicalize_name(name)][0] for name in tool.LINKED})
    assert closed.installed_not_pinned(pins, found) == []
    assert closed.open_requirements(pins, _requires(found), list(pins),
                                    omitted=tool.OMITTED) == []
    # datasets 5.1.0 (speculators caps it there) allows fsspec up to 2026.7.0 only.
    problems = closed.open_requirements({**pins, "fsspec": "2026.9.0"}, _requires(found),
                                        list(pins), omitted=tool.OMITTED)
    assert any(p.startswith("datasets==5.1.0 requires 'fsspec[http]") and
               p.endswith("the pin is fsspec==2026.9.0") for p in problems), problems


def test_the_lock_takes_each_files_sha256_from_the_index_or_from_the_local_file(tmp_path):
    """tools/lock.py on items of pip's report: an index's hash as given, a find-links file
    hashed, a remote file without a hash refused (it would be trust in a download)."""
    wheel = tmp_path / "w-1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    item = {"metadata": {"name": "w", "version": "1.0"}}
    assert lock._file_sha256({**item, "download_info": {
        "url": "https://x/w.whl", "archive_info": {"hashes": {"sha256": "ab" * 32}}}}) == "ab" * 32
    assert lock._file_sha256({**item, "download_info": {
        "url": wheel.as_uri(), "archive_info": {}}}) == hashlib.sha256(b"a wheel").hexdigest()
    with pytest.raises(lock.LockError, match="w from https://x/w.whl has no SHA-256"):
        lock._file_sha256({**item, "download_info": {"url": "https://x/w.whl",
                                                      "archive_info": {}}})
    with pytest.raises(lock.LockError, match="w is not an archive"):
        lock._file_sha256({**item, "download_info": {"url": "git+https://x/w",
                                                      "vcs_info": {}}})
