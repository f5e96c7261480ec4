"""A descriptor has one owner, and an interrupt is never masked by its cleanup
(util/paths.open_regular, what every small JSON read, the export's read-back included,
opens its file with).

An interrupt that came just after the file object took the descriptor used to make the
cleanup close it too: EBADF (exit 1, "Bad file descriptor", hiding the interrupt), or worse,
closing another file that had been given the same number meanwhile. Here the interrupt is a
real SIGINT raised at those points (its KeyboardInterrupt comes at the next bytecode), and a
sentinel file takes the freed number, as any other open would.
"""

from __future__ import annotations

import builtins
import os
import signal
from pathlib import Path

import pytest

from dspark_convert.errors import ConfigError
from dspark_convert.util import paths
from dspark_convert.util.paths import open_regular
from dspark_convert.util.strict_json import read_json_strict


def open_descriptors() -> set[int]:
    """This process' open descriptors (less the one the listing itself used)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue
        found.add(int(name))
    return found


def interrupted_after_handover(make, sentinel: Path, opened: list[int]):
    """``make`` (what hands the descriptor to a file object), then what a signal taken
    just after it does: the new file object is dropped (and closes the descriptor), another
    open takes the number, and SIGINT arrives."""

    def handover(fd, *args, **kwargs):
        make(fd, *args, **kwargs)                   # made and dropped: fd closed, once
        opened.append(os.open(sentinel, os.O_RDONLY))
        signal.raise_signal(signal.SIGINT)
        raise AssertionError("SIGINT was not taken")

    return handover


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    config, sentinel = tmp_path / "config.json", tmp_path / "sentinel"
    config.write_text('{"a": 1}')
    sentinel.write_text("another file\n")
    return config, sentinel


def test_an_interrupt_after_the_file_object_owns_the_descriptor_closes_nothing_else(
        files, monkeypatch):
    config, sentinel = files
    opened: list[int] = []
    # The hand-over is the built-in open on the descriptor (os.fdopen in the code this
    # guards against): both are wrapped, whichever the code calls.
    monkeypatch.setattr(paths, "open", interrupted_after_handover(builtins.open, sentinel, opened),
                        raising=False)
    monkeypatch.setattr(os, "fdopen", interrupted_after_handover(os.fdopen, sentinel, opened))
    before = open_descriptors()
    with pytest.raises(KeyboardInterrupt):
        open_regular(config, label="config.json", error=ConfigError)
    assert len(opened) == 1
    try:
        # The other file is still open, and is the only descriptor added.
        assert os.read(opened[0], 100) == b"another file\n"
        assert open_descriptors() - before == {opened[0]}
    finally:
        os.close(opened[0])


def test_an_interrupt_through_a_json_read_stays_an_interrupt(files, monkeypatch):
    """The read-back path: read_json_strict maps OSError to its refusal; an EBADF from the
    cleanup would have become that refusal (or exit 1) instead of the interrupt."""
    config, sentinel = files
    opened: list[int] = []
    monkeypatch.setattr(paths, "open", interrupted_after_handover(builtins.open, sentinel, opened),
                        raising=False)
    monkeypatch.setattr(os, "fdopen", interrupted_after_handover(os.fdopen, sentinel, opened))
    with pytest.raises(KeyboardInterrupt):
        read_json_strict(config, error=ConfigError)
    try:
        assert os.fstat(opened[0])       # not closed by anyone else
    finally:
        os.close(opened[0])


def test_an_interrupt_before_the_hand_over_closes_the_descriptor_once(files, monkeypatch):
    config, _ = files
    real_fstat = os.fstat

    def fstat_under_a_signal(fd):             # the first fstat: open_regular's check
        monkeypatch.setattr(os, "fstat", real_fstat)
        result = real_fstat(fd)
        signal.raise_signal(signal.SIGINT)
        return result

    before = open_descriptors()
    monkeypatch.setattr(os, "fstat", fstat_under_a_signal)
    with pytest.raises(KeyboardInterrupt):
        open_regular(config, label="config.json", error=ConfigError)
    assert open_descriptors() == before          # closed: not leaked


def test_a_regular_file_opens_and_its_descriptor_is_the_file_objects(files):
    config, _ = files
    before = open_descriptors()
    with open_regular(config, label="config.json", error=ConfigError) as fh:
        assert fh.read() == b'{"a": 1}'
        assert fh.fileno() in open_descriptors() - before
    assert open_descriptors() == before
