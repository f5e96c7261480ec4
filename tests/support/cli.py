"""The `dspark` CLI as the tests run it, and the assertions every refusal test makes.

Two ways to run the one real app (``dspark_convert.cli.main:app``):

``run_cli``: in this process. The same typer app, the same argument parsing, the same
``cli/errors.run`` that maps an exception to one line and an exit code; what differs from a
real process is only what an interpreter adds around it, and the runner puts that back:
stdout and stderr are separate UTF-8 text streams (stderr with ``backslashreplace``, as
Python's own), a warning is printed to stderr as a plain interpreter would print it (pytest
would otherwise swallow it into its summary, and a stray warning line breaks the one-line
rule), an exception that escapes the app is printed as a traceback with exit 1 (what a real
process shows), and the environment and working directory are restored afterwards. It is
the inner loop: no interpreter start-up, no import of numpy/gguf per case.

``run_process``: a real child, the console script ``dspark`` (or ``python -m
dspark_convert.cli.main``). For what only a process shows: signals, resource limits
(RLIMIT_AS, RLIMIT_FSIZE), import cost, start-up threads, a traceback that reaches a real
stderr. The canaries of each test module use it; everything else uses ``run_cli``.
"""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

from dspark_convert.util.atomic import _tmp_prefix

DSPARK = Path(sys.executable).parent / "dspark"
# Rich wraps tables at the terminal width; a child without a terminal reads COLUMNS. Every
# run, in-process or not, gets the same wide one, so that no line is cut differently.
COLUMNS = "200"
PROCESS_TIMEOUT = 120

# A plain interpreter's warning filters, in order (the `warnings` docs, "Default Warning
# Filter"); a warning none of them matches is shown once per location.
_INTERPRETER_FILTERS = [
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, None),
    ("ignore", PendingDeprecationWarning, None),
    ("ignore", ImportWarning, None),
    ("ignore", ResourceWarning, None),
]


def dspark_cmd(*args: str) -> list[str]:
    """The CLI as a user runs it, as the argv of a child of this interpreter."""
    return [sys.executable, "-m", "dspark_convert.cli.main", *args]


def run_process(*args: str, console_script: bool = True, timeout: float = PROCESS_TIMEOUT,
                env: dict | None = None, cwd: str | os.PathLike | None = None,
                preexec_fn=None) -> subprocess.CompletedProcess:
    """``dspark ARGS...`` in a real child process (the console script, or ``python -m``);
    ``env`` adds to (or, with a value of None, removes from) this process' environment."""
    cmd = [str(DSPARK), *args] if console_script else dspark_cmd(*args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=child_env(env), cwd=cwd, preexec_fn=preexec_fn)


def dspark(*args: str, timeout: float = PROCESS_TIMEOUT,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """The console script ``dspark ARGS...`` in a real child; ``env``, when given, is the
    child's whole environment (run_process adds to this one's instead)."""
    return subprocess.run([str(DSPARK), *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def child_env(extra: dict | None = None) -> dict[str, str]:
    env = {**os.environ, "COLUMNS": COLUMNS}
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def interrupt_on_terminal(cmd: list[str], marker: bytes, *, seconds: float, env: dict[str, str],
                          stdout=None) -> tuple[subprocess.Popen, bytes, bool]:
    """``cmd`` in a child with its stderr on a pty (its stdout too, unless ``stdout`` says
    where else), so that it draws its progress as on a terminal; SIGINT once ``marker``
    appears there. Read until the child has ended, or killed after ``seconds``. Returns
    the child, all it wrote on the terminal, and whether the signal was sent."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave if stdout is None else stdout,
                            stderr=slave, env=env)
    os.close(slave)
    seen, sent = b"", False
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            chunk = b""
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:            # EIO: the child has closed the terminal
                    pass
                seen += chunk
            if not sent and marker in seen:
                proc.send_signal(signal.SIGINT)
                sent = True
            if not chunk and proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return proc, seen, sent


def run_cli(*args: str, env: dict | None = None,
            cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """``dspark ARGS...`` run in this process by the real typer app; a CompletedProcess
    like ``run_process``'s (returncode, stdout, stderr), so that assertions read the same."""
    from dspark_convert.cli.main import app
    # huggingface_hub reads HF_HUB_OFFLINE once, at its import: imported here first under a
    # run's env={"HF_HUB_OFFLINE": "1"}, it would stay offline for every later test of this
    # process (the package reads the variable at call time, source/hub/cache.py). So it is
    # imported before the run's environment is applied.
    import huggingface_hub.constants  # noqa: F401

    out_bytes, err_bytes = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_bytes, encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(err_bytes, encoding="utf-8", errors="backslashreplace",
                           write_through=True)
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_streams = sys.stdout, sys.stderr
    code = 0
    try:
        os.environ.update(child_env(env))
        for key in [k for k, v in (env or {}).items() if v is None]:
            os.environ.pop(key, None)
        if cwd is not None:
            os.chdir(cwd)
        sys.stdout, sys.stderr = out, err
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in _INTERPRETER_FILTERS:
                warnings.filterwarnings(action, category=category, module=module or "",
                                        append=True)
            warnings.simplefilter("default", append=True)
            warnings.showwarning = _show_on_stderr
            try:
                app(args=list(args), prog_name="dspark", standalone_mode=True)
            except SystemExit as exc:
                code = _exit_status(exc.code)
            except Exception:           # what escapes the app: a real process prints this
                traceback.print_exc(file=err)
                code = 1
    finally:
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["dspark", *args], code,
                                       out_bytes.getvalue().decode("utf-8"),
                                       err_bytes.getvalue().decode("utf-8"))


def _show_on_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _exit_status(code: object) -> int:
    """What the interpreter makes of ``sys.exit(code)``: None is 0, an int is itself, anything
    else is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


# --- what every refusal test asserts ---------------------------------------------------------

def temp_siblings(out: Path) -> list[str]:
    """The hidden temporaries of an output (atomic.py names them after it)."""
    parent = Path(out).parent
    if not parent.is_dir():
        return []
    prefix = _tmp_prefix(Path(out))
    return sorted(n for n in os.listdir(parent) if n.startswith(prefix))


def assert_one_error_line(proc: subprocess.CompletedProcess | tuple[int, str], code: int,
                          *needles: str) -> str:
    """The rule for bad input: exactly one ``error:`` line on stderr, no traceback (on
    either stream), the error's own exit code; returns the line."""
    if isinstance(proc, tuple):
        (returncode, stderr), stdout = proc, ""
    else:
        returncode, stderr, stdout = proc.returncode, proc.stderr, proc.stdout or ""
    assert "Traceback" not in stderr and "Traceback" not in stdout, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert returncode == code, f"exit {returncode}, expected {code}: {lines[0]}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def assert_refused(proc: subprocess.CompletedProcess, error, needles=()) -> str:
    """``assert_one_error_line`` with the error class (its exit code, named on failure)."""
    try:
        return assert_one_error_line(proc, error.exit_code, *needles)
    except AssertionError as exc:
        raise AssertionError(f"{exc} ({error.__name__})") from None


def assert_valid(out: Path) -> None:
    """An artifact directory holds exactly its two files and passes `dspark validate`."""
    assert sorted(os.listdir(out)) == ["drafter.gguf", "manifest.json"]
    proc = run_cli("validate", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
