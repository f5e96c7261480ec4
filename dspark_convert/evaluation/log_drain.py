"""The environment every llama.cpp program runs in, here and in the tests: llama.cpp's
logger given the time to write what it queued before the process ends (data/log_drain.c
says why and how; docs/ENGINES.md "llama.cpp's log at exit" has the measurements).

The library is compiled once per process from the packaged C source, with the machine's C
compiler (``$CC``, else ``cc``, else ``gcc``: whoever built llama.cpp has one), into a
temporary directory removed at exit. Where it cannot be (not Linux, no compiler, the
compile fails, a temporary path LD_PRELOAD cannot hold), the programs run without it and
the eval's rerun of a cut log (engine_llama_cpp.rerun_while_cut) is all that is left;
``status()`` says which.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("data") / "log_drain.c"
COMPILE_SECONDS = 60


@dataclass(frozen=True)
class Drain:
    library: Path | None        # the compiled library, or None
    why_not: str | None         # when library is None: the reason, in words


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("cc") or shutil.which("gcc")


@functools.cache
def status() -> Drain:
    """The drain library for this process, compiled on first use."""
    if not sys.platform.startswith("linux"):
        return Drain(None, f"it reads /proc, which {sys.platform} does not have")
    cc = _compiler()
    if cc is None:
        return Drain(None, "no C compiler ($CC, cc or gcc) to build it")
    try:
        tmp = Path(tempfile.mkdtemp(prefix="dspark-log-drain-"))
    except OSError as exc:
        return Drain(None, f"no temporary directory to build it in: "
                           f"{os.strerror(exc.errno or 0) or exc}")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    library = tmp / "log_drain.so"
    # LD_PRELOAD splits its list on spaces and colons: a path holding one cannot go there.
    if any(c in str(library) for c in " :\t\n"):
        return Drain(None, f"its temporary path {library} holds a space or a colon "
                           "(LD_PRELOAD splits on them)")
    try:
        done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(library), str(SOURCE)],
                              capture_output=True, text=True, timeout=COMPILE_SECONDS,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Drain(None, f"{cc} could not compile it: {exc}")
    if done.returncode != 0 or not library.is_file():
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return Drain(None, f"{cc} could not compile it: {last[:200]}")
    return Drain(library, None)


def environment() -> dict[str, str]:
    """This process's environment with the drain library preloaded (when there is one),
    before whatever LD_PRELOAD already holds."""
    env = dict(os.environ)
    library = status().library
    if library is not None:
        env["LD_PRELOAD"] = " ".join(filter(None, [str(library), env.get("LD_PRELOAD", "")]))
    return env
