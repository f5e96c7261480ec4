"""speculators, installed from its registry package: the library whose format `dspark convert`
reads and `dspark export --engine speculators` writes, run by the tests as the oracle of that
format.

The one place that names the pinned version. speculators 0.9.0 (vllm-project/speculators on
PyPI) declares requirements its DSpark and DFlash classes never import (torchaudio,
torchvision, a CLI's, a trainer's) and caps transformers at 5.19.0, below the project's. So
it gets an environment of its own, with exactly what importing those classes, saving,
loading and running them imports: every distribution pinned below by version AND SHA-256 (the
wheels for CPython 3.11 on Linux x86-64, this kind of machine's), installed with ``pip
install --require-hashes --no-deps --only-binary :all:`` (a wheel of another hash is refused
by pip itself; nothing unpinned is pulled in). Before the install is put in place its set is
shown closed on the METADATA (tools/pins_closed.py): every requirement of every pin and of
the linked torch distributions is met by a pin, but those ``OMITTED`` names, which speculators
declares and its DSpark/DFlash classes never import. ``make speculators`` (and so ``make
test``) runs ``install``:

    python tools/speculators.py install   # a venv in the cache, the pins installed; reused
    python tools/speculators.py path      # print the interpreter of a whole install (exit 1: none)

Why ``import speculators.models.dspark`` needs datasets, pandas, pyarrow and openai: the
package's ``__init__`` imports every model it has, and EAGLE-3's imports the trainer's data
module (datasets), the data generator's client (openai) and hs-connectors; there is no way
to the DSpark class around them. transformers 5.19.0: the newest speculators allows; it
requires tokenizers >=0.23.1,<0.24 (0.23.3, the project's) and huggingface-hub >=1.31,<3
(2.4.0, the project's).

torch is not installed again: it is the project's own (``.venv``, the CPU build of torch 2.13.0
that constraints.txt pins; speculators allows >=2.9,<=2.14.1), linked in. ``torch-site/``
holds a symbolic link to each top-level entry of torch and of every distribution it requires
that the pins do not hold (sympy, mpmath, networkx, jinja2, markupsafe, setuptools), and one
``.pth`` file in the venv's site-packages (a relative line) puts that directory on sys.path after the venv's own
site-packages: the venv sees torch and what torch needs from the project's venv, and nothing
else of it (not its transformers 5.24, which speculators refuses). A .pth line naming the
project's whole site-packages would have let any missing pin be found there silently; a
second torch (~1 GB, and the CPU wheel is not on PyPI) would buy nothing. The links are made
by the interpreter that runs ``install`` (``make`` runs the project's); ``install`` refuses an
interpreter whose torch is not 2.13.0.

The install lives outside the checkout, in ``$DSPARK_ENGINE_CACHE`` (default
``~/.cache/dspark-convert``) under ``speculators-0.9.0/``:

    venv/                a virtual environment without pip: the pinned distributions only,
                         and dspark-convert-torch.pth
    venv/bin/python      the interpreter the tests run speculators with
    torch-site/          the links into the project's venv (torch and its requirements)
    requirements.txt     the file pip installed from (the pins below, with their hashes)
    install-info.json    package, version, transformers, Python, platform, the requirements'
                         SHA-256, the distributions, and the torch linked in (its version,
                         the site-packages it is in, the links)

Only a WHOLE install is used: a directory whose install-info.json is the object this script
writes for this interpreter's torch (read bounded, never waiting on a FIFO), whose
requirements.txt is the pins, whose interpreter runs (probed with ``-I -S``), whose
site-packages holds exactly the pinned distributions at their versions and the one .pth file,
every file each distribution's RECORD lists with a hash has that hash (pip writes RECORD),
nothing else is there and no entry is a link (tools/engine_venv.py's ``check_accounted``: a
stray ``sitecustomize.py`` would run at every start), and whose torch-site holds exactly the
links, each to the entry it names. The import probe runs only after that check. Anything else is named in one line, and ``install``
replaces it. An install is made in a hidden temporary sibling, checked by importing the DSpark
and DFlash classes with it, and renamed into place when complete; the console scripts pip
writes into ``venv/bin`` are removed (they would name the temporary directory). A killed
install leaves only a temporary, removed by the next run; Ctrl-C or SIGTERM ends pip and
removes it.

Standard library only: it runs before (and without) the package's own environment. What it
shares with tools/llama_cpp.py and tools/dspark_mlx.py is imported from tools/engine_cache.py
(the cache's location, removing, temporaries, signals, bounded reads, the JSON info file) and
tools/engine_venv.py (pinned wheel installs, the distributions and their RECORDs).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import engine_cache as cache   # tools/engine_cache.py, beside it: the cache, removing, signals
import engine_venv as venvs    # tools/engine_venv.py: pinned wheel installs, RECORD checks

InstallError = venvs.InstallError

PACKAGE = "speculators"
VERSION = "0.9.0"
TRANSFORMERS = "5.19.0"
TORCH = "2.13.0"            # the project's (constraints.txt); a local label (+cpu) may follow
DIR_NAME = f"{PACKAGE}-{VERSION}"
PYTHON = (3, 11)
PLATFORM = "linux-x86_64"
# Every distribution the venv holds, pinned by version and the SHA-256 of its wheel (pip
# download --no-deps --only-binary :all: on this kind of machine). The set is what importing
# speculators.models.dspark / .dflash imports, and what their save_pretrained,
# from_pretrained (loguru: the verifier's weights) and forward need; torch and its own
# requirements come from the project's venv (LINKED).
PINS = (
    ("annotated-doc", "0.0.7", "6bc31bbbec6dfaaedc1676dbc11dbda96fe22a2b5c400e9ebad113fec44a9dc6"),
    ("annotated-types", "0.8.0", "f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0"),
    ("anyio", "4.16.0", "c66ae634e0b8228396b801741beb3294326d4b6102f7bba4041c0dfb58c29026"),
    ("click", "8.5.1", "8bb5376d2006950386f8c6427613334a2acadc5f559cb80e638d00b4df957e37"),
    ("datasets", "5.1.0", "86fd08b280485aab82894d2c81842c4151d93b575efea0054315104cb7bc3cec"),
    ("dill", "0.4.1", "1e1ce33e978ae97fcfcff5638477032b801c46c7c65cf717f95fbc2248f79a9d"),
    ("filelock", "4.3.1", "79e43df8e9fe509cd83a3899a7c186c8077cbbe4d200a1ed3705c2f3bb6bc487"),
    ("fsspec", "2026.7.0", "b57ddbafedfaef7018c1ecab32aa200a9d7ca26b77965f64e48b70061249d279"),
    ("h11", "0.16.0", "63cf8bbe7522de3bf65932fda1d9c2772064ffb3dae62d55932da54b31cb6c86"),
    ("hf-xet", "1.8.0", "29dab7c904cd1914a0439c6e1306c12c7497c8bd32290fbe563ebf51ca4b6d6d"),
    ("hs-connectors", "0.9.0", "122f2c323397793c70c5bfc8c0adb1b4dd69995a2507b163509142d61fa3b920"),
    ("httpcore2", "2.16.2", "16051ae2a42f776007543f32de9349a317b23d2cbb4e1456b4bac0e88b87419a"),
    ("httpx2", "2.16.2", "f05c13aade4c45dbf1c9060647a1058f0acad62398fad96e741269edb33d46f5"),
    ("huggingface-hub", "2.4.0", "42ecfd93ede47bdd333daebbf66a32d7bfe2e18752754fe4d2d4f98a0179d801"),
    ("idna", "3.20", "ab7ae7122974553370f0bdb919e1a960b2cd1bc1ef0276416d896db81c14582c"),
    ("jiter", "0.19.0", "cc4a2b70ecd4f102583344c1f8cc5dc11618665b1889286bb3b4279c19b337dd"),
    ("loguru", "0.7.3", "31a33c10c8e1e10422bfd431aeb5d351c7cf7fa671e3c4df004162264b28220c"),
    ("markdown-it-py", "4.3.0", "7aa1511a46c39138de78d9eba92ce47e63124d8003fc98b3a351909e04239efa"),
    ("mdurl", "0.1.2", "84008a41e51615a49fc9966191ff91509e3c40b939176e643fd50a5c2196b8f8"),
    ("multiprocess", "0.70.19", "928851ae7973aea4ce0eaf330bbdafb2e01398a91518d5c8818802845564f45c"),
    ("numpy", "2.4.6", "89cd468399cfd2504718f0ba50e410dca55a170b61a02ad92bb18c8a65186e93"),
    ("openai", "3.57.0", "f97bc74024c06ced8428b56c4a3594066709d3082779bf9d0b4b6092fbf587a8"),
    ("packaging", "26.4", "81383611a09c1bc0b08b76e0fd5829d7c6824c65b27a6aee339da133f4233ea2"),
    ("pandas", "3.1.1", "4f1602f614bb83f443381dbcbb94c4ac764b2e50c8d6c965614c5cd83e328c47"),
    ("pyarrow", "26.0.1", "39cb0f2418282c24bea6ceda77b03e5a8f0a5766b63a8bf194d4e2a2c423548c"),
    ("pydantic", "2.14.4", "653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc"),
    ("pydantic-core", "2.50.5", "488319076ec92908b91fc6265ce761f1d78748f69f85518564fd16bf333e1b70"),
    ("pygments", "2.21.0", "2363c69b61c4a97c838da3b130dcd6468f4848992b21a82f2a63ec34377137d9"),
    ("python-dateutil", "4.0.0", "a5e246f79eb80475e691bf93862cead98decd8a498cf53ba0516fcdc0f50dc1c"),
    ("pyyaml", "6.0.4", "622aa875fa6533f25fedcffe23079357d65a690d462200afed5d8e9d0e01ebee"),
    ("regex", "2026.11.19", "86d3b2ea69b3c56df3e8ddbac6cd98eaf5a8c5b5e7e006897ebdf7a28d6818e6"),
    ("rich", "15.0.0", "33bd4ef74232fb73fe9279a257718407f169c09b78a87ad3d296f548e27de0bb"),
    ("safetensors", "0.8.0", "fd6f3f93c9a0a7cc2788ee63fb763353d4bd2e89b0751bc78fcf7dda00bea774"),
    ("shellingham", "1.5.4", "7ecfff8f2fd72616f7481040475a65b2bf8af90a56c89140852d1120324e8686"),
    ("sniffio", "1.3.1", "2f6da418d1f1e0fddd844478f41680e794e6051915791a034ff65e5f100525a2"),
    ("speculators", "0.9.0", "f0de7571274ce996d769ce81240379728dcb38701f77d2d34cfd0d670d1b4481"),
    ("tokenizers", "0.23.3", "376851d22bcf9d650a5c3090bb83e6cf9e895fbf0595369fa4cd43c1f69b5f87"),
    ("tqdm", "4.70.1", "c293e525e6fef9c20e8728fd4612df02a0aa31bb5fe91ecd93e123b1b7bffa73"),
    ("transformers", "5.19.0", "afcd2dd5f603ed28c1e1fcb00a338ccbb4ef5f878ed289635df8b58187afb518"),
    ("truststore", "0.10.5", "9aaaedaefaf06d8b206278cf8b5012bc897f485a874503501e12d776df78951c"),
    ("typer", "0.29.2", "f30731f8ca758368b836b3714872e58e395cef8fcaff918c853b1969ed5274e7"),
    ("typing-extensions", "4.16.0", "481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8"),
    ("typing-inspection", "0.4.5", "bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39"),
    ("tzdata", "2026.6", "0a10eec6e13ef16b627fabed9a5f2ba61a62b1c67f327305f4e7e412a70b4aec"),
    ("xxhash", "4.1.0", "5e713f5db9e1a8aafac59a45cc1ffce11ca507730f5dc12e212ea7b73d9debde"),
)
# torch and what it requires that PINS does not hold: linked from the project's venv.
LINKED = ("torch", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "setuptools")
# What speculators 0.9.0 requires and its DSpark/DFlash classes never import (its CLI's,
# trainer's and data generator's: torchvision and torchaudio would be a second torch build),
# left out on purpose: (who requires, what). install checks the rest is closed
# (tools/pins_closed.py), and that each of these is still required by a pin.
OMITTED = (("speculators", "aiohttp"), ("speculators", "httpx"), ("speculators", "protobuf"),
           ("speculators", "psutil"), ("speculators", "pydantic-settings"),
           ("speculators", "torchaudio"), ("speculators", "torchvision"),
           # datasets asks for fsspec[http]: aiohttp, for the remote filesystems it never opens
           ("fsspec", "aiohttp"))
INFO_FILE = "install-info.json"
REQUIREMENTS_FILE = "requirements.txt"
TORCH_SITE = "torch-site"
PTH_FILE = "dspark-convert-torch.pth"
INFO_MAX_BYTES = 64 * 1024
# What install imports with the new venv before it is put in place (and prints).
PROBE = ("import sys, speculators, torch, transformers\n"
         "from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig\n"
         "from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig\n"
         "import importlib.metadata as m\n"
         "print(m.version('speculators'), transformers.__version__, torch.__version__, "
         "torch.__file__)\n")
PROBE_SECONDS = 300


def requirements_text() -> str:
    """requirements.txt as pip installs it: one pinned line per distribution, its hash."""
    head = (f"# {PACKAGE}=={VERSION} with transformers=={TRANSFORMERS}: written by "
            "tools/speculators.py (pip install --require-hashes --no-deps)\n")
    return head + "".join(f"{name}=={version} --hash=sha256:{sha}\n"
                          for name, version, sha in PINS)


def install_dir() -> Path:
    return cache.cache_root() / DIR_NAME


def python_path(root: Path | None = None) -> Path:
    """The interpreter of an install, which the tests run speculators with."""
    return (install_dir() if root is None else root) / "venv" / "bin" / "python"


# --- torch, from the interpreter that runs this script --------------------------------------

def linked_torch() -> dict:
    """The torch this interpreter imports and what LINKED links: {"version", "site",
    "links": {entry: distribution}}; InstallError where its torch is not TORCH. (That every
    requirement of a linked distribution is pinned or linked is install's closure check.)"""
    try:
        torch = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        raise InstallError(f"{sys.executable} has no torch; run this script with the project's "
                           f"interpreter (.venv/bin/python, torch {TORCH})") from None
    if torch.version.split("+")[0] != TORCH:
        raise InstallError(f"{sys.executable} has torch {torch.version}; expected {TORCH} "
                           "(constraints.txt), the one speculators' venv links in")
    site = Path(torch.locate_file("")).resolve()
    links: dict[str, str] = {}
    for name in LINKED:
        dist = importlib.metadata.distribution(name)
        if Path(dist.locate_file("")).resolve() != site:
            raise InstallError(f"{name} is not in {cache.shown(site)} beside torch; expected "
                               "the project's venv to hold torch and its requirements")
        for file in dist.files or ():
            top = file.parts[0]
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            links.setdefault(top, name)
    return {"version": torch.version, "site": str(site), "links": dict(sorted(links.items()))}


def expected_info(torch: dict | None = None) -> dict:
    """install-info.json of a whole install for this interpreter's torch."""
    return {"package": PACKAGE, "version": VERSION, "transformers": TRANSFORMERS,
            "python": f"{PYTHON[0]}.{PYTHON[1]}", "platform": PLATFORM,
            "requirements_sha256": hashlib.sha256(requirements_text().encode()).hexdigest(),
            "distributions": {name: version for name, version, _ in PINS},
            "torch": torch if torch is not None else linked_torch()}


# The .pth line, relative to site-packages (venv/lib/pythonX.Y/site-packages): torch-site
# beside venv/, wherever the install is (site.py joins a relative line to the .pth's directory).
PTH_TEXT = f"../../../../{TORCH_SITE}\n"


# --- is this a whole install ---------------------------------------------------------------

def read_info(path: Path) -> dict:
    """install-info.json as a JSON object (strict: no duplicate key, no NaN)."""
    expected = (f"expected the JSON object tools/speculators.py writes (at most "
                f"{INFO_MAX_BYTES} bytes)")
    return cache.read_json_object(path, INFO_MAX_BYTES, expected, InstallError)


def _check_info(root: Path, want: dict) -> None:
    path = root / INFO_FILE
    cache.check_info(path, read_info(path), want, InstallError)


def _check_links(root: Path, torch: dict) -> None:
    """torch-site holds exactly the links install makes, each to the entry it names in the
    project's site-packages, which exists."""
    where = root / TORCH_SITE
    venvs.check_dir(where, "the links to torch and its requirements")
    site = Path(torch["site"])
    found = sorted(os.listdir(where))
    want = sorted(torch["links"])
    for name in want:
        link = where / name
        if name not in found:
            raise InstallError(f"{cache.shown(link)}: missing; expected a link to "
                               f"{cache.shown(site / name)}")
        mode = os.lstat(link).st_mode
        if not stat.S_ISLNK(mode):
            raise InstallError(f"{cache.shown(link)}: {cache.kind(mode)}; expected a link "
                               f"to {cache.shown(site / name)}")
        if os.readlink(link) != str(site / name):
            raise InstallError(f"{cache.shown(link)}: points to "
                               f"{cache.shown(os.readlink(link))}; expected "
                               f"{cache.shown(site / name)}")
        if not os.path.lexists(site / name):
            raise InstallError(f"{cache.shown(link)}: points to "
                               f"{cache.shown(site / name)}, which is gone")
    extra = sorted(set(found) - set(want))
    if extra:
        raise InstallError(f"{cache.shown(where / extra[0])}: not one of the links install "
                           "makes; expected only torch's and its requirements'")


def check_install(root: Path | None = None, *, torch: dict | None = None) -> None:
    """None when ``root`` (default: the cache's) is a whole install of the pins for this
    interpreter's torch; else InstallError, one line naming the path and what was expected."""
    root = install_dir() if root is None else root
    torch = torch if torch is not None else linked_torch()
    venvs.check_dir(root, f"the directory of a {PACKAGE} {VERSION} install")
    _check_info(root, expected_info(torch))
    req = root / REQUIREMENTS_FILE
    if venvs.read_bounded(req, INFO_MAX_BYTES, "expected the pinned requirements") != \
            requirements_text().encode():
        raise InstallError(f"{cache.shown(req)}: not the pinned requirements this script "
                           "writes")
    venvs.check_dir(root / "venv", "the install's virtual environment")
    venvs.check_python(python_path(root), PYTHON)
    site = venvs.site_packages(root, PYTHON)
    venvs.check_dir(site, "the venv's site-packages")
    pth = site / PTH_FILE
    if venvs.read_bounded(pth, INFO_MAX_BYTES, "expected one line naming torch-site") != \
            PTH_TEXT.encode():
        raise InstallError(f"{cache.shown(pth)}: not the one line {PTH_TEXT.strip()!r} "
                           f"(naming {TORCH_SITE}/ beside venv/)")
    _check_links(root, torch)
    venvs.check_distributions(site, PINS, allowed=(PTH_FILE,))


def install_problem(root: Path | None = None) -> str | None:
    """Why ``root`` is not a whole install (one line), or None where it is."""
    return venvs.problem_of(lambda: check_install(root))


def is_installed(root: Path | None = None) -> bool:
    return install_problem(root) is None


# --- installing ---------------------------------------------------------------------------

def _link(work: Path, torch: dict) -> None:
    where = work / TORCH_SITE
    where.mkdir()
    for name in torch["links"]:
        os.symlink(Path(torch["site"]) / name, where / name)
    (venvs.site_packages(work, PYTHON) / PTH_FILE).write_text(PTH_TEXT)


def _probe(root: Path, log: Path) -> str:
    """Import the DSpark and DFlash classes with the venv: one line, the versions it runs."""
    print(f"{PACKAGE}: importing its DSpark and DFlash classes (log: {log})", flush=True)
    try:
        proc = subprocess.run([str(python_path(root)), "-I", "-c", PROBE], capture_output=True,
                              text=True, timeout=PROBE_SECONDS, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise InstallError(f"importing speculators took over {PROBE_SECONDS} s") from None
    with open(log, "a") as out:
        out.write(proc.stdout + proc.stderr)
    words = proc.stdout.split()
    if proc.returncode != 0 or len(words) != 4:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise InstallError(f"importing speculators' DSpark and DFlash classes failed (exit "
                           f"{proc.returncode}): {' | '.join(tail)}")
    if words[:2] != [VERSION, TRANSFORMERS] or words[2].split("+")[0] != TORCH:
        raise InstallError(f"the venv runs speculators {words[0]}, transformers {words[1]}, "
                           f"torch {words[2]}; expected {VERSION}, {TRANSFORMERS}, {TORCH}")
    linked = os.path.abspath(root / TORCH_SITE)
    if not words[3].startswith(linked + os.sep):
        raise InstallError(f"the venv imports torch from {words[3]}; expected it from {linked}")
    return " ".join(words[:3])


def check_closed(root: Path) -> None:
    """The pins and the linked distributions meet every requirement of each other, OMITTED
    aside (tools/pins_closed.py, on their METADATA in the venv and in torch-site)."""
    pins = {name: version for name, version, _ in PINS}
    for name in LINKED:
        pins[name] = importlib.metadata.version(name)
    venvs.check_closed([venvs.site_packages(root, PYTHON), root / TORCH_SITE], pins,
                       [f"{name}=={version}" for name, version in pins.items()],
                       omitted=OMITTED)


def install(*, quiet_pip: bool = True) -> Path:
    """Install into the cache unless a whole install is there (anything else there is
    replaced); returns the install directory."""
    final = install_dir()
    torch = linked_torch()
    if install_problem(final) is None:
        return final
    venvs.this_python_fits(PYTHON, PLATFORM)
    final.parent.mkdir(parents=True, exist_ok=True)
    cache.remove_stale(final)
    work = cache.temporary(final, "install")
    try:
        cache.remove(work)
        work.mkdir()
        log = work / "install.log"
        (work / REQUIREMENTS_FILE).write_text(requirements_text())
        venvs.run_step(PACKAGE, [sys.executable, "-m", "venv", "--without-pip",
                                 str(work / "venv")], log, "python -m venv --without-pip")
        venvs.run_step(PACKAGE, [sys.executable, "-m", "pip", "--python", str(python_path(work)),
                                 "install", "--disable-pip-version-check", "--no-input",
                                 *(["--quiet"] if quiet_pip else []), "--require-hashes",
                                 "--no-deps", "--only-binary", ":all:",
                                 "--no-warn-script-location", "-r",
                                 str(work / REQUIREMENTS_FILE)], log,
                       f"pip install --require-hashes --no-deps {PACKAGE}=={VERSION} "
                       f"transformers=={TRANSFORMERS} and the {len(PINS) - 2} distributions "
                       "they import (about a minute)")
        venvs.remove_console_scripts(work)
        _link(work, torch)
        # Nothing runs from the venv before its site-packages is accounted for (the import
        # probe processes its .pth files), nor before the set is shown closed (--no-deps).
        venvs.check_distributions(venvs.site_packages(work, PYTHON), PINS, allowed=(PTH_FILE,))
        check_closed(work)
        _probe(work, log)
        log.unlink()
        (work / INFO_FILE).write_text(json.dumps(expected_info(torch), indent=2) + "\n")
        check_install(work, torch=torch)        # what `path` will accept, or a failure
        return cache.put_in_place(work, final, is_installed)
    except BaseException:
        cache.remove_quietly(work)
        raise


def main(argv: list[str] | None = None) -> int:
    return venvs.venv_main(
        argv, description=__doc__.splitlines()[0], package=PACKAGE, version=VERSION,
        how="`python tools/speculators.py install` (`make speculators`)",
        install_dir=install_dir, install_problem=install_problem, python_path=python_path,
        install=install, is_installed=is_installed,
        done=lambda root, seconds: (
            f"{PACKAGE} {VERSION} (transformers {TRANSFORMERS}, torch "
            f"{linked_torch()['version']} linked from {linked_torch()['site']}): "
            f"{python_path(root)} ({seconds:.0f} s)"))


if __name__ == "__main__":
    sys.exit(main())
