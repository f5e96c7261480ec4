"""The one output-path rule (util/atomic.check_outputs), through the real CLI of every command
with an output option, and the input-file rule for every option that names a file
(guarding against data loss, unbounded work before a refusal, exit 1 on long names, unclear
errors).

Each refusal is one `error:` line with the rule's own exit code, made before any work, and
nothing is touched: the working directory, the inputs and any old output stay byte for byte
as they were. Full-disk cases (a real ENOSPC) are in test_faults.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path

import pytest
from support.cli import assert_one_error_line, run_cli, run_process, temp_siblings
from support.paths import GOLDEN_TARGET as TARGET, REFERENCE_DRAFTER, REFERENCE_TRACE

from dspark_convert.errors import (
    CalibrationFileError,
    HubSpecError,
    InvalidArtifactError,
    ManifestError,
    OutputExistsError,
    OutputPathError,
    OutputWriteError,
    ParentArtifactError,
    PromptSetError,
    ReferenceTraceError,
)
from dspark_convert.evaluation.prompts import DEFAULT_PROMPTS
from dspark_convert.runtime.trace import MAX_REFERENCE_RUNS
from dspark_convert.util.atomic import PACKAGE_DIR, Output, check_outputs

HUB = "org/name@" + "0123456789abcdef" * 2 + "01234567"       # a pinned Hub spec, never fetched
SMOKE_FAST = ("--prompt-ids", "1,471", "--max-new-tokens", "2")


@pytest.fixture(scope="module")
def art(paired_artifacts) -> Path:
    return paired_artifacts["vanilla_conf_markov"]


def _listing(directory: Path) -> dict[str, bytes | None]:
    """Every entry under ``directory`` with its bytes (None for a directory or a link)."""
    out = {}
    for p in sorted(directory.rglob("*")):
        rel = str(p.relative_to(directory))
        out[rel] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


def _commands(art: Path) -> dict[str, callable]:
    """Each output option of each command: argv with OUT as that option's value."""
    return {
        "convert -o": lambda out: ["convert", str(REFERENCE_DRAFTER), "-o", out, "--force", "-q"],
        "quantize -o": lambda out: ["quantize", str(art), "-o", out, "--type", "q8_0", "--force", "-q"],
        "eval -o": lambda out: ["eval", str(art), "--target", str(TARGET), "-o", out, "--force"],
        "lock -o": lambda out: ["lock", HUB, "-o", out, "--force", "-q"],
        "smoke --trace": lambda out: ["smoke", str(art), "--target", str(TARGET), *SMOKE_FAST,
                                      "--trace", out],
        "smoke --plot": lambda out: ["smoke", str(art), "--target", str(TARGET), *SMOKE_FAST,
                                     "--plot", out],
    }


COMMAND_NAMES = ["convert -o", "quantize -o", "eval -o", "lock -o", "smoke --trace", "smoke --plot"]
# An unset variable (-o "$OUT"), whitespace, the working directory by any spelling, one of
# its ancestors, the root: with --force each used to wipe what it names.
NO_NEW_ENTRY = ["", " ", "\t", ".", "./", "..", "sub/..", "./.", "/", "CWD", "PARENT", "LINK"]


# --- class 1: an output path that names no new entry ------------------------------------

@pytest.mark.parametrize("path", NO_NEW_ENTRY)
@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_no_new_entry_is_refused_and_nothing_is_touched(art, tmp_path, command, path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "precious.txt").write_text("keep me\n")
    (ws / "sub").mkdir()
    (ws / "LINK-to-cwd").symlink_to(ws)
    out = {"CWD": str(ws), "PARENT": str(tmp_path), "LINK": "LINK-to-cwd"}.get(path, path)
    before, around = _listing(ws), sorted(os.listdir(tmp_path))
    proc = run_cli(*_commands(art)[command](out), cwd=ws)
    assert_one_error_line(proc, OutputPathError.exit_code, "expected a path naming a new")
    assert _listing(ws) == before
    assert sorted(os.listdir(tmp_path)) == around


def test_an_empty_output_is_called_empty(art, tmp_path):
    proc = run_cli("quantize", str(art), "-o", "", "--type", "q8_0", "--force", cwd=tmp_path)
    assert_one_error_line(proc, OutputPathError.exit_code, "''", "the path is empty")


def test_a_new_directory_under_the_working_directory_is_fine(art, tmp_path):
    proc = run_cli("quantize", str(art), "-o", "./q8", "--type", "q8_0", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path / "q8")) == ["drafter.gguf", "manifest.json"]


# --- class 1: outputs against what the run reads, and against each other --------------------

def _copy(src: Path, dst: Path) -> Path:
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)
    return dst


def _smoke(art, *args):
    return run_cli("smoke", str(art), "--target", str(TARGET), *args)


def test_smoke_plot_inside_the_compare_parent(art, tmp_path):
    parent = _copy(art, tmp_path / "parent")
    before = _listing(parent)
    proc = _smoke(art, *SMOKE_FAST, "--compare", str(parent), "--plot", str(parent / "drafter.gguf"))
    assert_one_error_line(proc, OutputExistsError.exit_code, "the --compare artifact", "lies inside")
    assert _listing(parent) == before


def test_smoke_trace_onto_the_reference(art, tmp_path):
    ref = _copy(REFERENCE_TRACE, tmp_path / "reference.json")
    before = ref.read_bytes()
    proc = _smoke(art, "--reference", str(ref), "--max-new-tokens", "24", "--trace", str(ref))
    assert_one_error_line(proc, OutputExistsError.exit_code, "is the --reference trace")
    assert ref.read_bytes() == before


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_smoke_trace_onto_a_link_to_the_reference(art, tmp_path, link):
    ref = _copy(REFERENCE_TRACE, tmp_path / "reference.json")
    before = ref.read_bytes()
    other = tmp_path / "other.json"
    os.link(ref, other) if link == "hard" else other.symlink_to(ref)
    proc = _smoke(art, "--reference", str(ref), "--max-new-tokens", "24", "--trace", str(other))
    assert_one_error_line(proc, OutputExistsError.exit_code, "is the --reference trace")
    assert ref.read_bytes() == before
    assert other.is_symlink() if link == "symbolic" else os.path.samefile(ref, other)


def test_smoke_trace_onto_the_calibration(art, tmp_path):
    cal = tmp_path / "calibration.json"
    cal.write_text('{"kept": true}\n')
    proc = _smoke(art, *SMOKE_FAST, "--calibration", str(cal), "--trace", str(cal))
    assert_one_error_line(proc, OutputExistsError.exit_code, "is the --calibration file")
    assert cal.read_text() == '{"kept": true}\n'


@pytest.mark.parametrize("plot", ["SAME", "./SAME", "sub/../SAME", "HARD", "SYMBOLIC"])
def test_smoke_trace_and_plot_on_one_path(art, tmp_path, plot):
    (tmp_path / "sub").mkdir()
    trace = tmp_path / "x"
    trace.write_text("old\n")
    os.link(trace, tmp_path / "HARD")
    (tmp_path / "SYMBOLIC").symlink_to(trace)
    proc = run_cli("smoke", str(art), "--target", str(TARGET), *SMOKE_FAST, "--trace", "x",
                   "--plot", plot.replace("SAME", "x"), cwd=tmp_path)
    assert_one_error_line(proc, OutputExistsError.exit_code, "--trace", "--plot",
                          "expected separate outputs")
    assert trace.read_text() == "old\n"


def test_smoke_trace_inside_the_target(art, tmp_path):
    target = _copy(TARGET, tmp_path / "target")
    before = _listing(target)
    proc = run_cli("smoke", str(art), "--target", str(target), *SMOKE_FAST,
                   "--trace", str(target / "config.json"))
    assert_one_error_line(proc, OutputExistsError.exit_code, "the target model")
    assert _listing(target) == before


def test_force_never_deletes_the_packaged_prompt_set():
    """eval reads the packaged prompt set without being told: --force over it, or over the
    directory holding it, is refused (checked by the rule alone: a broken rule here would
    delete the package's data)."""
    for path in (DEFAULT_PROMPTS, DEFAULT_PROMPTS.parent, PACKAGE_DIR):
        with pytest.raises(OutputExistsError, match="the prompt set|the dspark_convert package"):
            check_outputs([Output(path, "the report directory", directory=True)],
                          [(DEFAULT_PROMPTS, "the prompt set")], force=True)


def test_eval_report_inside_the_package(art):
    out = PACKAGE_DIR / "evaluation" / "data" / "report"
    proc = run_cli("eval", str(art), "--target", str(TARGET), "-o", str(out))
    assert_one_error_line(proc, OutputExistsError.exit_code, "the dspark_convert package")
    assert not out.exists()


def test_eval_report_over_the_directory_of_its_prompt_set(art, tmp_path):
    prompts = tmp_path / "p" / "one.jsonl"
    prompts.parent.mkdir()
    prompts.write_text('{"id": "a", "prompt_ids": [1, 471]}\n')
    proc = run_cli("eval", str(art), "--target", str(TARGET), "--prompts", str(prompts),
                   "-o", str(prompts.parent), "--force")
    assert_one_error_line(proc, OutputExistsError.exit_code, "holds the prompt set")
    assert prompts.read_text() == '{"id": "a", "prompt_ids": [1, 471]}\n'


def test_eval_report_through_a_link_to_an_artifact(art, tmp_path):
    copy = _copy(art, tmp_path / "art")
    before = _listing(copy)
    (tmp_path / "report").symlink_to(copy)
    proc = run_cli("eval", str(copy), "--target", str(TARGET), "-o", str(tmp_path / "report"),
                   "--force")
    assert_one_error_line(proc, OutputExistsError.exit_code)
    assert _listing(copy) == before


def test_quantize_output_through_a_link_to_its_parent(art, tmp_path):
    parent = _copy(art, tmp_path / "parent")
    before = _listing(parent)
    (tmp_path / "q").symlink_to(parent)
    proc = run_cli("quantize", str(parent), "-o", str(tmp_path / "q" / "sub"), "--type", "q8_0")
    assert_one_error_line(proc, OutputExistsError.exit_code, "lies inside the parent artifact")
    assert _listing(parent) == before


def test_convert_output_over_its_lock_file(tmp_path):
    lock = tmp_path / "pins.lock"
    lock.write_text("{}\n")
    for out in (lock, tmp_path):
        proc = run_cli("convert", HUB, "--lock", str(lock), "-o", str(out), "--force", "-q")
        assert_one_error_line(proc, OutputExistsError.exit_code)
        assert lock.read_text() == "{}\n"


def test_outputs_of_one_run_may_not_nest(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(OutputExistsError, match="lies inside"):
        check_outputs([Output(tmp_path / "a" / "b", "--trace", directory=False),
                       Output(tmp_path / "a", "--report", directory=True)], force=True)


# --- class 4: checked before the work --------------------------------------------------------

def test_eval_report_under_a_file_is_refused_before_anything_runs(art, tmp_path):
    (tmp_path / "afile").write_text("x\n")
    started = time.monotonic()
    proc = run_cli("eval", str(art), "--target", str(TARGET), "-o", str(tmp_path / "afile" / "report"))
    assert_one_error_line(proc, OutputWriteError.exit_code, "afile", "not a directory")
    assert proc.stdout == ""                       # not even the memory estimate
    assert time.monotonic() - started < 10
    assert (tmp_path / "afile").read_text() == "x\n"


def test_eval_report_in_an_unwritable_place_is_refused_before_anything_runs(art, tmp_path):
    if os.geteuid() == 0:
        out = Path("/proc") / f"dspark-test-{os.getpid()}" / "report"   # root can't write there either
    else:
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
        out = tmp_path / "ro" / "report"
    try:
        proc = run_cli("eval", str(art), "--target", str(TARGET), "-o", str(out))
        assert_one_error_line(proc, OutputWriteError.exit_code, "cannot write the output")
        assert proc.stdout == ""
        assert not out.exists()
    finally:
        if os.geteuid() != 0:
            (tmp_path / "ro").chmod(0o755)


def test_lock_into_a_missing_directory_is_refused_before_the_download(tmp_path):
    proc = run_cli("lock", HUB, "-o", str(tmp_path / "nodir" / "x.lock"),
                   env={"HF_HUB_OFFLINE": "1"})
    assert_one_error_line(proc, OutputWriteError.exit_code, "does not exist")


def _many_runs_reference(path: Path, runs: int) -> Path:
    run = {"prompt": [1], "output_ids": [1, 2], "acceptance_lengths": [1], "cycles": [],
           "temperature": 0.0, "confidence_threshold": 0.0}
    path.write_text(json.dumps({"runs": [run] * runs}, separators=(",", ":")))
    return path


def test_a_reference_with_too_many_runs_is_refused_at_once(art, tmp_path):
    """33,000 one-token runs in 3.8 MB (under the 4 MiB file cap): minutes of work before
    the first refusal until the count was bounded; now refused before the pairing."""
    ref = _many_runs_reference(tmp_path / "many.json", 33_000)
    assert ref.stat().st_size < 4 * 1024 * 1024
    started = time.monotonic()
    proc = run_cli("smoke", str(art), "--target", str(TARGET), "--reference", str(ref),
                   "--max-new-tokens", "1")
    assert_one_error_line(proc, ReferenceTraceError.exit_code, "33000 runs",
                          f"at most {MAX_REFERENCE_RUNS}")
    assert time.monotonic() - started < 10


def test_a_reference_at_the_run_limit_is_read(tmp_path):
    from dspark_convert.runtime.trace import load_reference

    ref = _many_runs_reference(tmp_path / "ok.json", MAX_REFERENCE_RUNS)
    assert len(load_reference(ref)) == MAX_REFERENCE_RUNS


# --- class 2: a name over 255 bytes, on every path option, with its command's code -----------

LONG = "n" * 300


def _long_name_cases(art: Path, tmp: Path) -> list[tuple[list[str], type]]:
    t = str(TARGET)
    return [
        (["quantize", str(art), "-o", LONG, "--type", "q8_0"], OutputWriteError),
        (["quantize", LONG, "-o", str(tmp / "q"), "--type", "q8_0"], ParentArtifactError),
        (["convert", str(REFERENCE_DRAFTER), "-o", LONG], OutputWriteError),
        (["convert", HUB, "--lock", LONG, "-o", str(tmp / "c")], HubSpecError),
        (["lock", HUB, "-o", LONG], OutputWriteError),
        (["eval", str(art), "--target", t, "-o", LONG], OutputWriteError),
        (["eval", str(art), "--target", t, "-o", str(tmp / "r"), "--calibration", LONG],
         CalibrationFileError),
        (["eval", str(art), "--target", t, "-o", str(tmp / "r"), "--prompts", LONG], PromptSetError),
        (["eval", LONG, "--target", t, "-o", str(tmp / "r")], InvalidArtifactError),
        (["smoke", str(art), "--target", t, *SMOKE_FAST, "--trace", LONG], OutputWriteError),
        (["smoke", str(art), "--target", t, *SMOKE_FAST, "--plot", LONG], OutputWriteError),
        (["smoke", str(art), "--target", t, "--reference", LONG], ReferenceTraceError),
        (["smoke", str(art), "--target", t, *SMOKE_FAST, "--calibration", LONG],
         CalibrationFileError),
        (["smoke", LONG, "--target", t, *SMOKE_FAST], InvalidArtifactError),
    ]


def test_a_name_over_255_bytes_gets_each_options_code(art, tmp_path):
    for argv, error in _long_name_cases(art, tmp_path):
        proc = run_cli(*argv, cwd=tmp_path)
        try:
            assert_one_error_line(proc, error.exit_code, "300 bytes long")
        except AssertionError as exc:
            raise AssertionError(f"{' '.join(argv)[:80]}: {exc}") from None
    assert sorted(os.listdir(tmp_path)) == []


# --- class 6: an input option naming a FIFO, a directory, nothing ----------------------------

def _fifo_argv(art: Path, fifo: str, tmp: Path) -> dict[str, tuple[list[str], type]]:
    t = str(TARGET)
    return {
        "smoke --calibration": (["smoke", str(art), "--target", t, *SMOKE_FAST, "--calibration", fifo],
                                CalibrationFileError),
        "smoke --reference": (["smoke", str(art), "--target", t, "--reference", fifo],
                              ReferenceTraceError),
        "eval --prompts": (["eval", str(art), "--target", t, "-o", str(tmp / "r"), "--prompts", fifo],
                           PromptSetError),
        "eval --calibration": (["eval", str(art), "--target", t, "-o", str(tmp / "r"),
                                "--calibration", fifo], CalibrationFileError),
        "convert --lock": (["convert", HUB, "--lock", fifo, "-o", str(tmp / "c")], HubSpecError),
    }


@pytest.mark.parametrize("option", [
    "smoke --calibration",
    *(pytest.param(o, marks=pytest.mark.slow)
      for o in ("smoke --reference", "eval --prompts", "eval --calibration", "convert --lock"))])
def test_a_fifo_as_an_input_file_is_named_as_one(art, tmp_path, option):
    """A FIFO is not "not found", and reading it would wait for a writer forever: each is
    refused at once as "a FIFO (named pipe), not a regular file" (real processes, so that a
    regression hangs one child under a timeout, not the test run)."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    argv, error = _fifo_argv(art, str(fifo), tmp_path)[option]
    proc = run_process(*argv, timeout=60)
    assert_one_error_line(proc, error.exit_code, "a FIFO (named pipe), not a regular file")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["pipe.json"]


@pytest.mark.parametrize("kind", ["directory", "missing"])
def test_other_input_files_that_are_not_files(art, tmp_path, kind):
    path = tmp_path / "cal.json"
    if kind == "directory":
        path.mkdir()
    proc = _smoke(art, *SMOKE_FAST, "--calibration", str(path))
    assert_one_error_line(proc, CalibrationFileError.exit_code,
                          "is a directory, not a regular file" if kind == "directory" else "not found")


def test_a_fifo_swapped_in_after_the_check_is_still_not_waited_on(tmp_path):
    """open_regular checks the open descriptor: the FIFO is opened non-blocking and refused."""
    from dspark_convert.util.paths import open_regular

    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    with pytest.raises(CalibrationFileError, match="a FIFO"):
        open_regular(fifo, label="calibration p", error=CalibrationFileError)


def test_refusals_leave_no_hidden_temporaries(art, tmp_path):
    out = tmp_path / "t.json"
    proc = _smoke(art, *SMOKE_FAST, "--trace", str(out), "--plot", str(out))
    assert proc.returncode == OutputExistsError.exit_code
    assert temp_siblings(out) == [] and os.listdir(tmp_path) == []


# --- class 5: a failed command leaves no report ------------------------------------------------

def test_smoke_compare_with_a_failing_parent_writes_no_report(art, tmp_path):
    """--compare's parent runs before --trace and --plot are written: a parent that fails
    validate fails the command, and neither report appears (nor an old one changes)."""
    parent = _copy(art, tmp_path / "parent")
    with open(parent / "manifest.json", "a") as fh:
        fh.write("junk\n")
    (tmp_path / "t.json").write_text("old\n")
    proc = _smoke(art, *SMOKE_FAST, "--compare", str(parent), "--trace", str(tmp_path / "t.json"),
                  "--plot", str(tmp_path / "p.png"))
    assert_one_error_line(proc, ManifestError.exit_code, "parent")
    assert (tmp_path / "t.json").read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["parent", "t.json"]


@pytest.mark.slow
def test_smoke_compare_with_a_passing_parent_writes_both_reports(art, tmp_path):
    parent = _copy(art, tmp_path / "parent")
    proc = _smoke(art, *SMOKE_FAST, "--compare", str(parent), "--trace", str(tmp_path / "t.json"),
                  "--plot", str(tmp_path / "p.png"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "t.json").read_text())["runs"]
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


# --- the rule as a property: any spelling of any path ------------------------------------------

_SEGMENTS = ["", ".", "..", " ", "sub", "new", "ws", "reads", "file.json", "dir", "L-cwd",
             "L-read", "L-dir", "L-up", "H", "new.png"]


def _sandbox(root: Path) -> tuple[Path, list[tuple[Path, str]]]:
    """ws/ (the working directory, with sub/) beside reads/ (file.json and dir/x: what the
    run reads), and in ws/: a hard link H to file.json, symbolic links to the working
    directory, to its parent, to the file and to the directory."""
    ws, reads = root / "ws", root / "reads"
    (ws / "sub").mkdir(parents=True)
    (reads / "dir").mkdir(parents=True)
    (reads / "file.json").write_text("{}\n")
    (reads / "dir" / "x").write_text("x\n")
    os.link(reads / "file.json", ws / "H")
    (ws / "L-cwd").symlink_to(ws)
    (ws / "L-up").symlink_to(root)
    (ws / "L-read").symlink_to(reads / "file.json")
    (ws / "L-dir").symlink_to(reads / "dir")
    return ws, [(reads / "file.json", "the file"), (reads / "dir", "the directory")]


def _within(a: Path, b: Path) -> bool:
    """``a`` is ``b`` or lies inside it, by path or by device and inode of an ancestor."""
    if a == b or a.is_relative_to(b):
        return True
    try:
        target = os.stat(b)
    except OSError:
        return False
    for level in (a, *a.parents):
        try:
            st = os.stat(level)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            return True
    return False


@pytest.mark.slow  # the property: make test; the fast loop keeps one example per rule above
def test_any_spelling_of_a_path_is_refused_or_safe(tmp_path_factory):
    """Whatever the spelling (., .., links, a hard link, absolute or relative, whitespace),
    check_outputs either refuses with one of the output errors or returns paths that name
    no working directory or ancestor of it, are not and do not hold or lie inside what the
    run reads, and (without --force) do not exist yet."""
    from hypothesis import example, given
    from hypothesis import strategies as st
    from support.fuzz import fuzz_settings

    from dspark_convert.util.atomic import _real

    ws, reads = _sandbox(tmp_path_factory.mktemp("rule"))
    path = st.builds(lambda absolute, parts: ("/".join([str(ws)] + parts) if absolute
                                              else "/".join(parts)),
                     st.booleans(), st.lists(st.sampled_from(_SEGMENTS), max_size=4))

    @fuzz_settings(500)
    @given(st.lists(st.tuples(path, st.booleans()), min_size=1, max_size=2), st.booleans())
    @example([("H", False)], True)                  # a hard link to what is read
    @example([("L-up/reads", True)], True)          # holds it, through a link
    @example([("L-cwd/", True)], True)              # the working directory, through a link
    @example([("new", False), ("./sub/../new", False)], True)    # one path spelled twice
    def check(outputs, force):
        saved = os.getcwd()
        os.chdir(ws)
        try:
            specs = [Output(p, f"out{i}", directory=d) for i, (p, d) in enumerate(outputs)]
            try:
                got = check_outputs(specs, reads, force=force)
            except (OutputPathError, OutputExistsError, OutputWriteError):
                return
            cwd = _real(ws)
            for spec, out in zip(specs, got):
                real = _real(out)
                assert not _within(cwd, real), (spec.path, "holds the working directory")
                for read, _ in reads:
                    read = _real(read)
                    assert not _within(real, read) and not _within(read, real), (spec.path, read)
                assert force or not os.path.lexists(out), spec.path
            reals = [_real(out) for out in got]
            if len(reals) == 2:
                assert not _within(reals[0], reals[1]) and not _within(reals[1], reals[0])
        finally:
            os.chdir(saved)
        assert sorted(os.listdir(ws)) == ["H", "L-cwd", "L-dir", "L-read", "L-up", "sub"]
        assert sorted(os.listdir(ws.parent)) == ["reads", "ws"]

    check()


def test_a_relative_output_when_the_working_directory_is_gone(art, tmp_path):
    import subprocess

    from support.cli import dspark_cmd

    gone = tmp_path / "gone"
    proc = subprocess.run(["sh", "-c", 'mkdir "$1" && cd "$1" && rmdir "$1" && shift && exec "$@"',
                           "sh", str(gone), *dspark_cmd("quantize", str(art), "-o", "q8",
                                                        "--type", "q8_0")],
                          capture_output=True, text=True, timeout=120)
    assert_one_error_line(proc, OutputWriteError.exit_code, "the working directory is gone")
