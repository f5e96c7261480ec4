"""requirements.lock: every distribution of the project's environment (``make install``,
``make test``), pinned by version and the SHA-256 of its file, resolved by pip itself.

pyproject.toml keeps ranges (for those who install the library into their own environment);
the checkout's environment is this closed set instead, so that the test suite's result does
not depend on what the registry holds the day it runs. ``make lock`` runs this script:

    python tools/lock.py            # resolve and (re)write requirements.lock
    python tools/lock.py --check    # exit 1 when requirements.lock is not of the current inputs

How: ``pip install --dry-run --ignore-installed --report`` (nothing is installed; pip's own
resolver, with pip's configuration: its index, its find-links) of the package's requirements,
its ``dev`` extra and its build requirement (setuptools: ``make install`` builds the editable
project without build isolation, which would fetch setuptools unpinned), under
constraints.txt (the CPU torch that lies in /opt/wheels on this kind of machine). Each file
pip chose is written with the SHA-256 pip's index gave for it, or, for a local file
(find-links), the SHA-256 of the file itself. The lock is for the interpreter that runs this
script (CPython 3.11 on Linux x86-64 here): markers are evaluated for it, and the hashes are
those of its wheels.

The lock's first lines record the SHA-256 of its inputs (the requirement lists of
pyproject.toml and constraints.txt); ``--check`` (and tests/test_pins_closed.py) fail when
they changed and the lock was not regenerated. That the set is closed (every requirement of
every locked distribution met by a pin) is tools/pins_closed.py's check.

Standard library only (it runs before the project's environment exists).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import tomllib
import urllib.parse
import urllib.request
from pathlib import Path

import engine_cache as cache   # tools/engine_cache.py, beside it: a file's SHA-256

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
CONSTRAINTS = ROOT / "constraints.txt"
PYPROJECT = ROOT / "pyproject.toml"
# The extra of pyproject.toml the checkout's environment installs (tests, llama.cpp's converter).
EXTRA = "dev"
INPUTS_LINE = "# inputs-sha256: "


class LockError(Exception):
    """pip failed or its report is not what this script reads; the message says which."""


def requirements() -> list[str]:
    """What the environment must hold: the package's requirements, its dev extra's and its
    build requirement (pyproject.toml)."""
    project = tomllib.loads(PYPROJECT.read_text())
    return [*project["project"]["dependencies"],
            *project["project"]["optional-dependencies"][EXTRA],
            *project["build-system"]["requires"]]


def constraints() -> list[str]:
    """constraints.txt's lines less comments and blank lines."""
    lines = (line.split("#", 1)[0].strip() for line in CONSTRAINTS.read_text().splitlines())
    return [line for line in lines if line]


def inputs_sha256() -> str:
    """The SHA-256 of what the lock is made from: the requirement lists and constraints.txt's
    constraints (not their comments)."""
    data = json.dumps({"requirements": requirements(), "constraints": constraints()},
                      sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()


def _file_sha256(item: dict) -> str:
    """The SHA-256 of the file pip chose for one item of its report."""
    info = item.get("download_info")
    name = item.get("metadata", {}).get("name", "?")
    if not isinstance(info, dict) or not isinstance(info.get("url"), str):
        raise LockError(f"pip's report: {name} has no download_info.url")
    archive = info.get("archive_info")
    if not isinstance(archive, dict):
        raise LockError(f"pip's report: {name} is not an archive ({info['url']}); expected a "
                        "wheel or an sdist from an index or find-links")
    hashes = archive.get("hashes") or {}
    if isinstance(hashes.get("sha256"), str):
        return hashes["sha256"]
    url = urllib.parse.urlparse(info["url"])
    if url.scheme == "file":
        return cache.sha256_of(Path(urllib.request.url2pathname(url.path)))
    raise LockError(f"pip's report: {name} from {info['url']} has no SHA-256; expected an index "
                    "that publishes hashes, or a local file")


def resolve() -> list[tuple[str, str, str]]:
    """(name, version, sha256) of every distribution pip resolves the requirements to."""
    with tempfile.TemporaryDirectory(prefix="dspark-lock-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
               "--no-input", "--quiet", "--dry-run", "--ignore-installed", "--report",
               str(report), "-c", str(CONSTRAINTS), *requirements()]
        print(f"lock: {' '.join(cmd[:4])} --dry-run --ignore-installed --report (pip's "
              "resolver; a minute or two)", flush=True)
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              env={**os.environ, "PIP_REQUIRE_VIRTUALENV": "0"})
        if proc.returncode != 0:
            raise LockError(f"pip failed (exit {proc.returncode}): "
                            + " | ".join(proc.stderr.strip().splitlines()[-8:]))
        items = json.loads(report.read_text()).get("install")
    if not isinstance(items, list) or not items:
        raise LockError("pip's report lists nothing to install")
    pins = []
    for item in items:
        meta = item.get("metadata", {})
        pins.append((meta["name"], meta["version"], _file_sha256(item)))
    return sorted(pins, key=lambda pin: pin[0].lower())


def lock_text(pins: list[tuple[str, str, str]]) -> str:
    head = ("# The project's environment, closed: every distribution by version and SHA-256.\n"
            "# Generated by tools/lock.py (`make lock`) from pyproject.toml and constraints.txt;\n"
            "# do not edit. `make install` installs exactly this (pip --require-hashes --no-deps).\n"
            f"{INPUTS_LINE}{inputs_sha256()}\n")
    return head + "".join(f"{name}=={version} --hash=sha256:{sha}\n"
                          for name, version, sha in pins)


def recorded_inputs(text: str) -> str | None:
    """The inputs' SHA-256 a lock's text records, or None."""
    for line in text.splitlines():
        if line.startswith(INPUTS_LINE):
            return line[len(INPUTS_LINE):].strip()
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when requirements.lock is not of the current inputs")
    args = parser.parse_args(argv)
    if args.check:
        got = recorded_inputs(LOCK.read_text()) if LOCK.is_file() else None
        if got != inputs_sha256():
            print(f"lock: {LOCK.name} is not of the current pyproject.toml requirements and "
                  "constraints.txt: run `make lock`", file=sys.stderr)
            return 1
        return 0
    try:
        pins = resolve()
    except LockError as exc:
        print(f"lock: {exc}", file=sys.stderr)
        return 1
    tmp = LOCK.with_name(LOCK.name + ".tmp")
    tmp.write_text(lock_text(pins))
    os.replace(tmp, LOCK)
    print(f"lock: {LOCK.name}: {len(pins)} distributions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
