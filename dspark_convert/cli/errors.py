"""How the CLI turns library errors into one line and an exit code.

``run`` is the only place an exception becomes output: a DSparkError prints
``error: <message>`` (one line, on stderr) and exits with the class's code; anything else is
a bug, printed as one line too (``--debug`` shows the traceback); Ctrl-C and SIGTERM exit
130 and 143 after the library's cleanup has run.
"""

from __future__ import annotations

import signal
import sys
import traceback
from collections.abc import Callable

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


def run(action: Callable[[], int | None], *, debug: bool = False, as_json: bool = False) -> None:
    """Run a command body; exit with its code, or map its exception to one."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        code = action() or 0
    except DSparkError as exc:
        if debug:
            traceback.print_exc()
        emit_error(exc, as_json=as_json)
        code = exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted; nothing was written\n")
        code = EXIT_INTERRUPTED
    except Terminated:
        sys.stderr.write("error: terminated; nothing was written\n")
        code = EXIT_TERMINATED
    except typer.Exit:
        raise
    except Exception as exc:  # a bug: one line unless --debug
        if debug:
            traceback.print_exc()
        hint = "" if debug else " (rerun with --debug for the traceback)"
        error = InternalError(f"internal error: {type(exc).__name__}: {exc}{hint}")
        emit_error(error, as_json=as_json)
        code = error.exit_code
    finally:
        signal.signal(signal.SIGTERM, previous)
    raise typer.Exit(code)
