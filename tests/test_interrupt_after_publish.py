"""An interrupt says what is true: "nothing was written" only before an output is published;
once it is in place (renamed whole), SIGINT and SIGTERM exit 130 / 143 naming it, in place
and whole (util/atomic.published_outputs, cli/errors.run).

The real CLI runs in a child whose stdout is a pipe already full: the child blocks at its
first write to stdout, which for most commands is the summary printed after the output is
published, and the test sees it blocked there (/proc/PID/wchan names the pipe write) before
it signals. The rest of stdout is read only then, as a slow reader would. `smoke` and `eval`
print their memory estimate before any work: without --json that is where they block, which
is the before-publish case (nothing may be left behind). The in-process cases hold the step
that publishes: a signal that comes during the rename is taken once the output is in place
and recorded as such, never between the two.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dspark_convert.cli.errors import EXIT_INTERRUPTED, EXIT_TERMINATED
from dspark_convert.synthetic import make_synthetic_checkpoint
from dspark_convert.util import atomic
from dspark_convert.util.atomic import atomic_directory, atomic_files, published_outputs
from support.cli import DSPARK, assert_one_error_line, assert_valid, child_env, temp_siblings
from support.paths import GOLDEN_TARGET

SIGNALS = {signal.SIGINT: (EXIT_INTERRUPTED, "interrupted"),
           signal.SIGTERM: (EXIT_TERMINATED, "terminated")}
BLOCK_TIMEOUT_S = 120.0          # the child's start-up, torch's import and its work included
EXIT_TIMEOUT_S = 60.0
POLL_S = 0.01


def _default_sigint() -> None:
    # A child inherits an ignored SIGINT (a background job); Python then installs no
    # KeyboardInterrupt handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def full_pipe() -> tuple[int, int, int]:
    """(read end, write end, bytes in it): a pipe filled until a write would block, so that
    a child writing to it blocks until it is read."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    filled = 0
    try:
        while True:
            filled += os.write(w, b"\0" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    return r, w, filled


def blocked_writing(pid: int) -> bool:
    """The process sleeps in a pipe write (its kernel wait channel says so)."""
    try:
        return "pipe_write" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def read_all(fd: int, proc: subprocess.Popen, deadline: float) -> bytes:
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                return data
            data += chunk
    pytest.fail(f"the child did not close its stdout in time (exit {proc.poll()})")


def signal_while_blocked(args: list[str], sig: int, *, published: Path | None,
                         env: dict | None = None) -> tuple[int, str, str]:
    """``dspark ARGS`` with its stdout a full pipe: once it is blocked writing to it (and,
    with ``published``, once that path exists: after the publish), send ``sig``, then read
    its stdout to the end. ``env`` adds to the child's environment. Returns (exit code,
    stderr, what it printed on stdout)."""
    r, w, filled = full_pipe()
    proc = subprocess.Popen([str(DSPARK), *args], stdin=subprocess.DEVNULL, stdout=w,
                            stderr=subprocess.PIPE, env=child_env(env), preexec_fn=_default_sigint)
    os.close(w)
    try:
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        while not (blocked_writing(proc.pid) and (published is None or published.exists())):
            if proc.poll() is not None:
                pytest.fail(f"dspark {args[0]} exited ({proc.returncode}) before it blocked on "
                            f"its stdout: {proc.stderr.read().decode()}")
            if time.monotonic() > deadline:
                pytest.fail(f"dspark {args[0]} did not block on its stdout in time")
            time.sleep(POLL_S)
        proc.send_signal(sig)
        stdout = read_all(r, proc, time.monotonic() + EXIT_TIMEOUT_S)
        stderr = proc.stderr.read().decode()
        proc.wait(timeout=EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        os.close(r)
    assert stdout[:filled] == b"\0" * filled
    return proc.returncode, stderr, stdout[filled:].decode()


def assert_in_place(result: tuple[int, str, str], sig: int, *outputs: Path) -> None:
    """The interrupt's exit code and its one line naming each output in place and whole."""
    code, stderr, _stdout = result
    exit_code, word = SIGNALS[sig]
    line = assert_one_error_line((code, stderr), exit_code, word, "in place and whole")
    assert "nothing was written" not in line
    for out in outputs:
        assert str(out) in line
        assert temp_siblings(out) == []


def assert_nothing_written(result: tuple[int, str, str], sig: int, *outputs: Path) -> None:
    code, stderr, _stdout = result
    exit_code, word = SIGNALS[sig]
    assert_one_error_line((code, stderr), exit_code, word, "nothing was written")
    for out in outputs:
        assert not os.path.lexists(out)
        assert temp_siblings(out) == []


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# --- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("interrupt") / "src"
    make_synthetic_checkpoint(src)
    return src


@pytest.fixture(scope="module")
def reference_artifact(paired_artifacts) -> Path:
    """DeepSpec's reference drafter converted with its target (the pairing recorded)."""
    return paired_artifacts["vanilla_conf_markov"]


def _smoke(artifact: Path, trace: Path, plot: Path, *extra: str) -> list[str]:
    """One short smoke run on the CPU writing both reports."""
    return ["smoke", str(artifact), "--target", str(GOLDEN_TARGET), "--device", "cpu",
            "--max-new-tokens", "8", "--prompt-ids", "1,17,33,90", "--trace", str(trace),
            "--plot", str(plot), *extra]


def _eval(artifact: Path, root: Path, out: Path, *extra: str) -> list[str]:
    """One short eval on the CPU, of two prompts written in ``root``, into ``out``."""
    prompts = root / "p.jsonl"
    rows = [{"id": f"p{i}", "prompt_ids": [1, 17 + 5 * i, 33, 90, 250 - i, 7 + i]} for i in range(2)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["eval", str(artifact), "--target", str(GOLDEN_TARGET), "--device", "cpu",
            "--prompts", str(prompts), "--max-new-tokens", "8", "--threshold", "0.5", "-o",
            str(out), *extra]


# --- after the publish: the output is named, in place and whole --------------------------------

@pytest.mark.parametrize("sig", [
    signal.SIGINT,
    pytest.param(signal.SIGTERM, marks=pytest.mark.slow),   # the export case is the canary
], ids=["SIGINT", "SIGTERM"])
def test_convert_interrupted_on_its_summary_names_the_artifact_in_place(source, tmp_path, sig):
    out = tmp_path / "art"
    result = signal_while_blocked(["convert", str(source), "-o", str(out), "-q"], sig,
                                  published=out)
    assert_in_place(result, sig, out)
    assert_valid(out)
    assert os.listdir(tmp_path) == ["art"]


@pytest.mark.parametrize("engine, sig", [
    pytest.param("deepspec", signal.SIGTERM, id="deepspec-SIGTERM"),
    pytest.param("speculators", signal.SIGINT, id="speculators-SIGINT", marks=pytest.mark.slow),
])
def test_export_interrupted_on_its_summary_names_the_checkpoint_in_place(
        reference_artifact, tmp_path, engine, sig):
    from support.cli import run_cli

    out, clean = tmp_path / "exported", tmp_path / "clean"
    result = signal_while_blocked(["export", str(reference_artifact), "--engine", engine,
                                   "--target", str(GOLDEN_TARGET), "-o", str(out), "-q"], sig,
                                  published=out)
    assert_in_place(result, sig, out)
    # Whole: byte for byte what an uninterrupted export writes.
    proc = run_cli("export", str(reference_artifact), "--engine", engine, "--target",
                   str(GOLDEN_TARGET), "-o", str(clean), "-q")
    assert proc.returncode == 0, proc.stderr
    assert files_of(out) == files_of(clean)
    assert sorted(files_of(out)) == ["config.json", "model.safetensors"]


@pytest.mark.slow   # a process each: the fast loop keeps convert's and export's
def test_quantize_interrupted_on_its_summary_names_the_artifact_in_place(reference_artifact,
                                                                         tmp_path):
    out = tmp_path / "q8"
    result = signal_while_blocked(["quantize", str(reference_artifact), "-o", str(out),
                                   "--type", "q8_0", "-q"], signal.SIGTERM, published=out)
    assert_in_place(result, signal.SIGTERM, out)
    assert_valid(out)


@pytest.mark.slow   # a process, and the loopback Hub
def test_lock_interrupted_on_its_summary_names_the_lock_file_in_place(tmp_path):
    from support.hub_server import HubServer
    from support.paths import REFERENCE_DRAFTER

    from dspark_convert.source.hub.lockfile import read_lock

    lock = tmp_path / "dspark.lock"
    with HubServer() as hub:
        commit = hub.add_directory("org/draft", REFERENCE_DRAFTER, refs=("main",))
        result = signal_while_blocked(
            ["lock", f"org/draft@{commit}", "-o", str(lock)], signal.SIGTERM, published=lock,
            env={"HF_HOME": str(tmp_path / "hf_home"), "HF_ENDPOINT": hub.url,
                 "HF_HUB_CACHE": None, "HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None})
    assert_in_place(result, signal.SIGTERM, lock)
    assert read_lock(lock).commit == commit


@pytest.mark.slow   # torch in the child: ~10 s
def test_conform_interrupted_on_its_summary_names_the_report_in_place(reference_artifact, tmp_path):
    from hostile.conform_corpus import deepseek_trace, lines_text
    from support.paths import REFERENCE_TRACE

    trace = tmp_path / "t.jsonl"
    trace.write_text(lines_text(deepseek_trace(REFERENCE_TRACE)))
    out = tmp_path / "report"
    result = signal_while_blocked(["conform", str(reference_artifact), "--target",
                                   str(GOLDEN_TARGET), "--trace", str(trace), "-o", str(out),
                                   "--device", "cpu", "--json"], signal.SIGINT, published=out)
    assert_in_place(result, signal.SIGINT, out)
    assert sorted(os.listdir(out)) == ["report.json", "report.md"]
    assert json.loads((out / "report.json").read_text())["lines"] > 0


@pytest.mark.slow   # torch in the child
def test_smoke_interrupted_on_its_json_names_both_reports_in_place(reference_artifact, tmp_path):
    trace, plot = tmp_path / "t.json", tmp_path / "a.png"
    result = signal_while_blocked(_smoke(reference_artifact, trace, plot, "--json"),
                                  signal.SIGTERM, published=plot)
    assert_in_place(result, signal.SIGTERM, trace, plot)
    assert json.loads(trace.read_text())["runs"]
    assert plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow   # torch in the child
def test_eval_interrupted_on_its_json_names_the_report_in_place(reference_artifact, tmp_path):
    out = tmp_path / "eval"
    result = signal_while_blocked(_eval(reference_artifact, tmp_path, out, "--json"),
                                  signal.SIGINT, published=out)
    assert_in_place(result, signal.SIGINT, out)
    assert json.loads((out / "report.json").read_text())["complete"] is True


# --- before the publish: nothing was written, nothing left ---------------------------------------

@pytest.mark.slow   # torch in the child
def test_smoke_interrupted_before_its_reports_writes_nothing(reference_artifact, tmp_path):
    """Blocked on the memory estimate line, printed before the drafter runs."""
    trace, plot = tmp_path / "t.json", tmp_path / "a.png"
    result = signal_while_blocked(_smoke(reference_artifact, trace, plot), signal.SIGINT,
                                  published=None)
    assert_nothing_written(result, signal.SIGINT, trace, plot)
    assert os.listdir(tmp_path) == []


@pytest.mark.slow   # torch in the child
def test_eval_terminated_before_its_report_writes_nothing(reference_artifact, tmp_path):
    out = tmp_path / "eval"
    result = signal_while_blocked(_eval(reference_artifact, tmp_path, out), signal.SIGTERM,
                                  published=None)
    assert_nothing_written(result, signal.SIGTERM, out)
    assert os.listdir(tmp_path) == ["p.jsonl"]


# --- in process: the rename and its record are one step -----------------------------------------

def _signal_during(monkeypatch, name: str, sig: int = signal.SIGINT) -> None:
    """atomic.``name`` (a rename) sends ``sig`` to this process, then renames: the signal
    arrives while the publish is under way."""
    real = getattr(atomic, name)

    def renaming_under_a_signal(*args, **kwargs):
        signal.raise_signal(sig)
        return real(*args, **kwargs)

    monkeypatch.setattr(atomic, name, renaming_under_a_signal)


def test_a_signal_during_the_publish_is_taken_once_the_directory_is_in_place(tmp_path,
                                                                               monkeypatch):
    out = tmp_path / "out"
    _signal_during(monkeypatch, "_publish")
    with published_outputs() as published:
        with pytest.raises(KeyboardInterrupt):
            with atomic_directory(out) as tmp:
                (tmp / "a.txt").write_text("whole\n")
        assert list(published) == [out]
    assert files_of(out) == {"a.txt": b"whole\n"}
    assert os.listdir(tmp_path) == ["out"]


def test_a_signal_while_replacing_is_taken_once_the_old_directory_is_gone(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old\n")
    _signal_during(monkeypatch, "_publish")
    with published_outputs() as published:
        with pytest.raises(KeyboardInterrupt):
            with atomic_directory(out, force=True) as tmp:
                (tmp / "new.txt").write_text("new\n")
        assert list(published) == [out]
    assert files_of(out) == {"new.txt": b"new\n"}
    assert os.listdir(tmp_path) == ["out"]       # the old one removed, no temporary left


def test_a_signal_during_the_files_publish_is_taken_once_all_are_in_place(tmp_path, monkeypatch):
    first, second = tmp_path / "t.json", tmp_path / "a.png"
    _signal_during(monkeypatch, "_publish_file")
    with published_outputs() as published:
        with pytest.raises(KeyboardInterrupt):
            atomic_files([(first, lambda fh: fh.write(b"{}")),
                          (second, lambda fh: fh.write(b"png"))])
        assert list(published) == [first, second]
    assert first.read_bytes() == b"{}" and second.read_bytes() == b"png"
    assert sorted(os.listdir(tmp_path)) == ["a.png", "t.json"]


def test_a_signal_before_the_publish_records_nothing_and_leaves_nothing(tmp_path):
    out = tmp_path / "sub" / "out"
    with published_outputs() as published:
        with pytest.raises(KeyboardInterrupt):
            with atomic_directory(out) as tmp:
                (tmp / "a.txt").write_text("half\n")
                signal.raise_signal(signal.SIGINT)
        assert list(published) == []
    assert os.listdir(tmp_path) == []


def test_outputs_are_recorded_only_while_a_record_is_open(tmp_path):
    with atomic_directory(tmp_path / "before"):
        pass
    with published_outputs() as outer:
        with published_outputs() as inner:
            with atomic_directory(tmp_path / "both"):
                pass
        with atomic_directory(tmp_path / "outer"):
            pass
    with atomic_directory(tmp_path / "after"):
        pass
    assert list(inner) == [tmp_path / "both"]
    assert list(outer) == [tmp_path / "both", tmp_path / "outer"]
    assert atomic._RECORDS == []


# --- in process: the CLI's line (cli/errors.run) -------------------------------------------------

def _exit_code(action) -> int:
    import typer

    from dspark_convert.cli.errors import run

    with pytest.raises(typer.Exit) as done:
        run(action)
    return done.value.exit_code


def test_the_cli_names_what_was_published_before_the_interrupt(tmp_path, capsys):
    out = tmp_path / "out"

    def publish_then_interrupt() -> int:
        with atomic_directory(out) as tmp:
            (tmp / "a.txt").write_text("whole\n")
        signal.raise_signal(signal.SIGTERM)
        return 0

    assert _exit_code(publish_then_interrupt) == EXIT_TERMINATED
    assert capsys.readouterr().err == (f"error: terminated after the output was written: {out} is "
                                       "in place and whole\n")
    assert files_of(out) == {"a.txt": b"whole\n"}


def test_the_cli_says_nothing_was_written_when_nothing_was(tmp_path, capsys):
    def interrupt_while_writing() -> int:
        with atomic_directory(tmp_path / "out") as tmp:
            (tmp / "a.txt").write_text("half\n")
            signal.raise_signal(signal.SIGINT)
        return 0

    assert _exit_code(interrupt_while_writing) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "error: interrupted; nothing was written\n"
    assert os.listdir(tmp_path) == []


def test_an_interrupt_while_a_refusal_is_printed_still_wins(monkeypatch, capsys):
    """Ctrl-C while the refusal's line is written (a slow stderr): 130 and the interrupt's
    line, not a traceback out of the refusal's handler."""
    import sys

    from dspark_convert.errors import ConfigError

    real_write = sys.stderr.write
    calls: list[str] = []

    def write_under_a_signal(text: str) -> int:
        calls.append(text)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)
        return real_write(text)

    monkeypatch.setattr(sys.stderr, "write", write_under_a_signal)

    def refuse() -> int:
        raise ConfigError("config.json: refused")

    assert _exit_code(refuse) == EXIT_INTERRUPTED
    assert calls[-1] == "error: interrupted; nothing was written\n"
