"""How the CLI turns library errors into one line and an exit code.

``run`` is the only place an exception becomes output: a DSparkError prints
``error: <message>`` (one line, on stderr) and exits with the class's code; anything else is
a bug, printed as one line too (``--debug`` shows the traceback); Ctrl-C and SIGTERM exit
130 and 143 after the library's cleanup has run, with one line that says what is true
then: "nothing was written" before any output was published, or which outputs are in
place and whole once one was (util/atomic.published_outputs records each publication in
the step that makes it: an interrupt while the summary waits on a slow stdout comes after).
"""

from __future__ import annotations

import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import typer

from dspark_convert.errors import DSparkError, InternalError
from dspark_convert.util.json_out import dumps
from dspark_convert.util.text import shown

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that atomic writers clean up."""


def _on_sigterm(signum, frame):  # pragma: no cover - exercised through a subprocess test
    raise Terminated()


def emit_error(error: DSparkError, *, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(dumps({"ok": False, **error.to_dict()}, indent=2) + "\n")
    # Names from inputs are in the message: escaped, so the line cannot rewrite itself.
    sys.stderr.write(f"error: {shown(error.message)}\n")


@contextmanager
def _signals_default() -> Iterator[None]:
    """SIGINT and SIGTERM at their default action while the interrupt's line is written: a
    second Ctrl-C or SIGTERM then ends the process by that signal (the shell still sees
    130 / 143), never a traceback out of the handler of the first."""
    previous = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def interrupt_line(stop: BaseException, published: Sequence[Path]) -> tuple[str, int]:
    """The one line and the exit code of Ctrl-C (130) or SIGTERM (143): "nothing was
    written" when no output was published, else each output the run published, in place
    and whole (the atomic rename put it there whole, and nothing undoes it)."""
    what, code = (("interrupted", EXIT_INTERRUPTED) if isinstance(stop, KeyboardInterrupt)
                  else ("terminated", EXIT_TERMINATED))
    if not published:
        return f"error: {what}; nothing was written", code
    names = " and ".join(shown(str(path)) for path in published)
    verb = "is" if len(published) == 1 else "are"
    return (f"error: {what} after the output was written: {names} {verb} in place and "
            "whole"), code


def run(action: Callable[[], int | None], *, debug: bool = False, as_json: bool = False) -> None:
    """Run a command body; exit with its code, or map its exception to one. An interrupt
    wins wherever it comes: in the body, as the record closes, or while a refusal's line
    is printed."""
    from dspark_convert.util.atomic import published_outputs

    previous = signal.getsignal(signal.SIGTERM)
    published: Sequence[Path] = ()     # what the body put in place; still read once closed
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)     # inside: a SIGTERM just after is caught
        try:
            with published_outputs() as published:
                code = action() or 0
        except DSparkError as exc:
            if debug:
                traceback.print_exc()
            emit_error(exc, as_json=as_json)
            code = exc.exit_code
        except typer.Exit:
            raise
        except Exception as exc:  # a bug: one line unless --debug
            if debug:
                traceback.print_exc()
            hint = "" if debug else " (rerun with --debug for the traceback)"
            error = InternalError(f"internal error: {type(exc).__name__}: {exc}{hint}")
            emit_error(error, as_json=as_json)
            code = error.exit_code
    except (KeyboardInterrupt, Terminated) as stop:
        line, code = interrupt_line(stop, published)
        with _signals_default():
            sys.stderr.write(line + "\n")
    finally:
        signal.signal(signal.SIGTERM, previous)
    raise typer.Exit(code)
