"""Progress of a long `pip install`, a few lines instead of minutes of silence.

`make install` (and so the first `make demo` or `make test`) installs requirements.lock into
a fresh .venv/: about 60 distributions, torch among them, two minutes or more on a small
machine. ``pip --quiet`` shows nothing for that long, and pip's own output is hundreds of
lines. This runs the pip command given after ``--``, keeps everything it prints in LOG, and
shows instead:

    install: 12/62 distributions fetched (numpy==2.3.1)
    install: unpacking 62 distributions into .venv/ (torch is most of it) ... 40 s
    install: 62 distributions in 1 min 52 s (pip's output: .venv/pip-install.log)

On a terminal the counting is one line rewritten in place; elsewhere (CI logs) a line every
tenth of the way and one every 15 s while pip unpacks. When pip fails, the end of LOG is
printed and its exit status is this script's. Standard library only: it runs before the venv
holds anything.

    python tools/install_progress.py LOG -- PIP-COMMAND...
"""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

HEARTBEAT = 15.0          # seconds between lines while pip is silent (not on a terminal)
TAIL = 40                 # lines of LOG shown when pip fails

_FOUND = re.compile(r"^(?:Collecting|Processing|Obtaining)\s+(\S+)")
_NAME_IN_PATH = re.compile(r"([A-Za-z0-9_.]+)-(\d[^-]*)-")


def expected(command: list[str]) -> int | None:
    """How many distributions the requirement files given with -r pin (None: none given)."""
    total, seen = 0, False
    for flag, value in zip(command, command[1:]):
        if flag in ("-r", "--requirement"):
            seen = True
            for line in Path(value).read_text().splitlines():
                line = line.strip()
                if line and not line.startswith(("#", "-")) and "==" in line:
                    total += 1
    return total if seen else None


def _label(found: str) -> str:
    """``numpy==2.3.1``, or a wheel path's name and version."""
    if "/" in found or found.endswith(".whl"):
        match = _NAME_IN_PATH.search(Path(found).name)
        if match:
            return f"{match.group(1)}=={match.group(2)}"
    return found


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: install_progress.py LOG -- COMMAND...", file=sys.stderr)
        return 2
    log_path, command = Path(argv[0]), argv[2:]
    total = expected(command)
    of_total = f"/{total}" if total else ""
    tty = sys.stdout.isatty()
    start = time.monotonic()
    lines: queue.Queue[str | None] = queue.Queue()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", bufsize=1)

        def pump() -> None:
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        found, unpacking, last_shown, step = 0, False, time.monotonic(), max(1, (total or 60) // 10)
        heavy = ""             # torch, when it is one of them: most of the unpacking

        def show(text: str, *, final: bool = False) -> None:
            nonlocal last_shown
            last_shown = time.monotonic()
            if tty:
                sys.stdout.write("\r\033[K" + text + ("\n" if final else ""))
            else:
                sys.stdout.write(text + "\n")
            sys.stdout.flush()

        show(f"install: pip install of {total or 'the'} pinned distributions into a fresh venv "
             f"(minutes on a small machine; pip's output goes to {log_path})", final=True)
        while True:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                line = ""
            if line is None:
                break
            if line:
                log.write(line)
                log.flush()
                match = _FOUND.match(line)
                if match:
                    found += 1
                    if _label(match.group(1)).lower().startswith("torch=="):
                        heavy = " (torch is most of it)"
                    if tty or found == 1 or found % step == 0 or found == total:
                        show(f"install: {found}{of_total} distributions fetched ({_label(match.group(1))})")
                    continue
                if line.startswith("Installing collected packages"):
                    unpacking = True
                    if tty:
                        sys.stdout.write("\n")
                    show(f"install: unpacking {found} distributions{heavy} ... "
                         f"{_duration(time.monotonic() - start)}")
                    continue
            if unpacking and time.monotonic() - last_shown >= (1.0 if tty else HEARTBEAT):
                show(f"install: unpacking {found} distributions{heavy} ... "
                     f"{_duration(time.monotonic() - start)}")
        code = proc.wait()
    if tty:
        sys.stdout.write("\n")
    if code != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL:]
        sys.stderr.write("\n".join(tail) + "\n")
        print(f"install: pip failed (exit {code}); its whole output: {log_path}", file=sys.stderr)
        return code
    print(f"install: {found} distributions in {_duration(time.monotonic() - start)} "
          f"(pip's output: {log_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
