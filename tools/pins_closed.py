"""Whether a set of pins is closed: every requirement of every pinned distribution (its
markers and the extras asked of it evaluated for this interpreter) is met by a pin.

pip installs the project's lock (requirements.lock) and each engine's PINS with ``--no-deps``:
pip then takes exactly the pinned set and resolves nothing, so nothing unpinned can come in
(the registry's newest transformers, say), but nothing checks either that the set is whole.
This is that check, made on the installed distributions' own METADATA (``Requires-Dist``):

- the requirements asked for (``roots``: the project's pyproject.toml requirements, or
  ``mlx[cpu]==0.32.4``), and every pinned distribution's own, are each met by a pin whose
  version is in the requirement's specifier; an extra asked of a pin (``mlx[cpu]``,
  ``transformers[chat-template]``) brings in that extra's requirements too;
- a requirement the environment leaves out on purpose is named in ``omitted`` ((who requires,
  what) pairs, tools/speculators.py's), and an omission nobody needs any more is a problem
  too, so that table stays true.

``open_requirements`` returns one line per problem naming the requirement (who requires what)
and the pin (missing, or its version); the tests (tests/test_pins_closed.py) apply it to the
project's lock with the .venv's METADATA and to each engine's PINS with its cached install's,
and the engine installers apply it before an install is put in place.

It needs ``packaging`` (the project's lock holds it; the engine scripts run with the project's
interpreter under ``make``), imported here only: the engine scripts' ``path`` stays standard
library only.
"""

from __future__ import annotations

import email.parser
from collections.abc import Iterable
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

import engine_cache as cache   # tools/engine_cache.py, beside it: the bounded read

METADATA_MAX_BYTES = 4 << 20        # the largest METADATA of the pins is ~200 KB


class MetadataError(Exception):
    """A distribution's METADATA cannot be read as this check needs it; the message says which."""


def read_metadata(dist_info: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) of one installed distribution's METADATA, read
    bounded and never through a link (the engine cache's one bounded read)."""
    path = dist_info / "METADATA"
    data = cache.read_bounded(path, METADATA_MAX_BYTES, "expected the METADATA pip wrote",
                              MetadataError)
    msg = email.parser.BytesHeaderParser().parsebytes(data)
    name, version = msg.get("Name"), msg.get("Version")
    if not name or not version:
        raise MetadataError(f"{path}: no Name or Version field")
    return name, version, [str(r) for r in msg.get_all("Requires-Dist") or ()]


def installed(sites: Iterable[Path]) -> dict[str, tuple[str, list[str]]]:
    """canonical name -> (version, Requires-Dist) of every distribution in ``sites``' *.dist-info
    directories (the first site that holds a name wins, as on sys.path)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for site in sites:
        for entry in sorted(Path(site).glob("*.dist-info")):
            name, version, requires = read_metadata(entry)
            found.setdefault(canonicalize_name(name), (version, requires))
    return found


def _applies(req: Requirement, extra: str, env: dict) -> bool:
    return req.marker is None or req.marker.evaluate({**env, "extra": extra})


def open_requirements(pins: dict[str, str], requires: dict[str, list[str]],
                      roots: Iterable[str], *, omitted: Iterable[tuple[str, str]] = (),
                      root_name: str = "the environment") -> list[str]:
    """One line per requirement no pin meets. ``pins``: name -> version; ``requires``: name ->
    its Requires-Dist lines (from its METADATA; a pin without is a problem); ``roots``: the
    requirements asked for (by ``root_name``); ``omitted``: (requirer, requirement) name pairs
    left out on purpose. Markers are evaluated for this interpreter."""
    env = default_environment()
    pins = {canonicalize_name(n): v for n, v in pins.items()}
    omitted = {(canonicalize_name(a), canonicalize_name(b)) for a, b in omitted}
    used: set[tuple[str, str]] = set()
    problems: list[str] = []
    queue: list[tuple[str, str]] = []           # (pinned name, extra asked of it; "" = none)
    seen: set[tuple[str, str]] = set()

    def meet(who: str, who_name: str, line: str, extra: str) -> None:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            problems.append(f"{who} requires {line!r}, which does not parse ({exc})")
            return
        if not _applies(req, extra, env):
            return
        name = canonicalize_name(req.name)
        if (who_name, name) in omitted:
            used.add((who_name, name))
            return
        if name not in pins:
            problems.append(f"{who} requires {str(req)!r}: no pin of {name}")
            return
        try:
            ok = req.specifier.contains(Version(pins[name]), prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            problems.append(f"{who} requires {str(req)!r}: the pin is {name}=={pins[name]}")
            return
        for wanted in ("", *sorted(req.extras)):
            if (name, wanted) not in seen:
                seen.add((name, wanted))
                queue.append((name, wanted))

    for line in roots:
        meet(root_name, "", line, "")
    for name in sorted(pins):
        if (name, "") not in seen:
            seen.add((name, ""))
            queue.append((name, ""))
    while queue:
        name, extra = queue.pop(0)
        if name not in requires:
            problems.append(f"{name}=={pins[name]} is pinned and its METADATA was not found; "
                            "expected it installed")
            continue
        who = f"{name}[{extra}]=={pins[name]}" if extra else f"{name}=={pins[name]}"
        for line in requires[name]:
            meet(who, name, line, extra)
    for requirer, requirement in sorted(omitted - used):
        problems.append(f"{requirer} is declared to require {requirement} (left out on purpose), "
                        "and no pin requires it: remove the omission")
    return problems


def installed_not_pinned(pins: dict[str, str],
                         found: dict[str, tuple[str, list[str]]]) -> list[str]:
    """One line per pin whose installed version is another (the METADATA is then not the
    pin's, and the check above would not be of the pins)."""
    return [f"{name}: {found[canonicalize_name(name)][0]} is installed; the pin is {version}"
            for name, version in sorted(pins.items())
            if canonicalize_name(name) in found
            and found[canonicalize_name(name)][0] != version]
