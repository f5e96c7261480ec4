"""dspark-mlx, installed from its registry packages: the second engine `dspark eval --engine
dspark-mlx` runs beside the reference runtime and llama.cpp.

The one place that names the pinned versions. dspark-mlx 0.1.0 is a pure-Python package on
PyPI; it runs on MLX, whose Linux CPU build is ``mlx[cpu]`` (``mlx`` with ``mlx-cpu``), and it
brings mlx-lm (the host of a Qwen3 target) and mlx-vlm (the host of a Gemma4 target). Every
distribution it needs is pinned below by version AND SHA-256 (the wheels for CPython 3.11 on
Linux x86-64, this kind of machine's) and installed with ``pip install --require-hashes
--no-deps --only-binary :all:``: a wheel of another hash is refused by pip itself, and pip
resolves nothing (without --no-deps it resolved mlx-audio's ``transformers[chat-template]``
to whatever the registry held that day, not the pin). That the pins are all the install
needs is checked on their METADATA before the install is put in place (tools/pins_closed.py:
every requirement, markers and extras evaluated, met by a pin). ``make dspark-mlx`` (and so
``make test``) runs ``install``:

    python tools/dspark_mlx.py install   # a venv in the cache, the pins installed; reused
    python tools/dspark_mlx.py path      # print the interpreter of a whole install (exit 1: none)

The install lives outside the checkout, in ``$DSPARK_ENGINE_CACHE`` (default
``~/.cache/dspark-convert``) under ``dspark-mlx-<version>/``:

    venv/                a virtual environment without pip: the pinned distributions only
    venv/bin/python      the engine's interpreter (`--engine dspark-mlx=PYTHON` takes it)
    requirements.txt     the file pip installed from (the pins below, with their hashes)
    install-info.json    package, version, mlx, Python, platform, the requirements' SHA-256

Only a WHOLE install is used: a directory whose install-info.json is the object this script
writes (read bounded, never waiting on a FIFO), whose requirements.txt is the pins, whose
interpreter runs (probed with ``-I -S``: nothing of site-packages runs), whose site-packages
holds exactly the pinned distributions at their versions, every file each distribution's
RECORD lists with a hash has that hash (pip writes RECORD; ~15,000 files, 825 MB, about 3 s)
and nothing else is there (no stray ``.pth``, ``sitecustomize.py`` or ``usercustomize.py``,
which would run at the interpreter's every start; no symbolic link, which could lead out of
the cache: tools/engine_venv.py's ``check_accounted``). Anything else is named in one line, and
``install`` replaces it. An install is made in a hidden temporary sibling and renamed into
place when complete; the console scripts pip writes into ``venv/bin`` are removed (they would
name the temporary directory; the engine is run as ``venv/bin/python``). A killed install
leaves only a temporary, removed by the next run; Ctrl-C or SIGTERM ends pip and removes it.

Standard library only: it runs before (and without) the package's own environment. What it
shares with tools/llama_cpp.py and tools/speculators.py is imported from tools/engine_cache.py
(the cache's location, removing, temporaries, signals, bounded reads, the JSON info file) and
tools/engine_venv.py (pinned wheel installs, the distributions and their RECORDs).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import engine_cache as cache   # tools/engine_cache.py, beside it: the cache, removing, signals
import engine_venv as venvs    # tools/engine_venv.py: pinned wheel installs, RECORD checks

InstallError = venvs.InstallError

PACKAGE = "dspark-mlx"
VERSION = "0.1.0"
MLX = "0.32.4"
DIR_NAME = f"{PACKAGE}-{VERSION}"
# What the pins are for: the wheels of CPython 3.11 on Linux x86-64 (manylinux), this kind of
# machine's; anywhere else pip would need other files, which are not pinned.
PYTHON = (3, 11)
PLATFORM = "linux-x86_64"
# Every distribution the install holds, pinned by version and the SHA-256 of its wheel (pip
# download of dspark-mlx==0.1.0 and mlx[cpu]==0.32.4 resolved on this kind of machine). The
# order is pip's requirements-file order; the set is closed (pip refuses an unpinned one).
PINS = (
    ("annotated-doc", "0.0.7", "6bc31bbbec6dfaaedc1676dbc11dbda96fe22a2b5c400e9ebad113fec44a9dc6"),
    ("annotated-types", "0.8.0", "f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0"),
    ("anyio", "4.16.0", "c66ae634e0b8228396b801741beb3294326d4b6102f7bba4041c0dfb58c29026"),
    ("certifi", "2026.10.19.post1", "1324c476b4811eff41a8bc2122cd0bbd4d9c7234c725446d99ab1612b3a7fdd2"),
    ("cffi", "2.1.1", "34e261f78cb6ceaaa36f42f2613f4380d94d9c759a9c73c769ee6e0247364632"),
    ("charset-normalizer", "3.5.3", "2a6f937e0b70133d1f826d0a253331b6fe1a4c874808cc12e16f2fb8177042f4"),
    ("click", "8.5.1", "8bb5376d2006950386f8c6427613334a2acadc5f559cb80e638d00b4df957e37"),
    ("cryptography", "50.0.2", "9dab55f57c74c3cad24c323bacbbd04be4705ba6eb0d92e920b1fc4837ed5079"),
    ("datasets", "5.2.0", "4be9e2882caaf5db13eadc39e93f3da2a995187b99acebac1595bf6c58dfa927"),
    ("dill", "0.4.1", "1e1ce33e978ae97fcfcff5638477032b801c46c7c65cf717f95fbc2248f79a9d"),
    ("dspark-mlx", "0.1.0", "1aecf970270f07329056b0e3253b625081b7fc5e6a73aca2bbe16ec96907d91d"),
    ("fastapi", "0.165.0", "896f48462042bb4f162147eb8fac7e858753dc1f486765709baf105d70e4fc5b"),
    ("filelock", "4.3.1", "79e43df8e9fe509cd83a3899a7c186c8077cbbe4d200a1ed3705c2f3bb6bc487"),
    ("fsspec", "2026.9.0", "8dd6e646e99ea382bd85f97a45e6b526a442d79423a7dc673f1e2756d05fcb5f"),
    ("h11", "0.16.0", "63cf8bbe7522de3bf65932fda1d9c2772064ffb3dae62d55932da54b31cb6c86"),
    ("hf-xet", "1.8.0", "29dab7c904cd1914a0439c6e1306c12c7497c8bd32290fbe563ebf51ca4b6d6d"),
    ("httpcore2", "2.16.2", "16051ae2a42f776007543f32de9349a317b23d2cbb4e1456b4bac0e88b87419a"),
    ("httpx2", "2.16.2", "f05c13aade4c45dbf1c9060647a1058f0acad62398fad96e741269edb33d46f5"),
    ("huggingface-hub", "2.4.0", "42ecfd93ede47bdd333daebbf66a32d7bfe2e18752754fe4d2d4f98a0179d801"),
    ("idna", "3.20", "ab7ae7122974553370f0bdb919e1a960b2cd1bc1ef0276416d896db81c14582c"),
    ("jinja2", "3.1.6", "85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67"),
    ("llguidance", "1.9.1", "dfac6021d9c4c5ef16b3a1d336c05ca5e8208ff30dec29d1c63ebcafbee3a346"),
    ("markdown-it-py", "4.3.0", "7aa1511a46c39138de78d9eba92ce47e63124d8003fc98b3a351909e04239efa"),
    ("markupsafe", "3.0.4", "6da83a088f8ef93b2d483a8232a4dbf4d69d3d8496b568a03c56becac43e1808"),
    ("mdurl", "0.1.2", "84008a41e51615a49fc9966191ff91509e3c40b939176e643fd50a5c2196b8f8"),
    ("miniaudio", "1.71", "06222d80b057ca4beccb6f97a134c2c2bf646ef7890e1759cfc09db7eecec44d"),
    ("mlx", "0.32.4", "6267be0db81a9d850b3ecd9bf0cf7dd0f439408db9fbc59237e37fda3f7676b0"),
    ("mlx-audio", "0.6.2", "db57a552bd0ab16aa1fcc435d5fdb1c692d78e64926fa1f73669805c782e5731"),
    ("mlx-cpu", "0.32.4", "0e0a24fa2ce8b6b94d2e6a90604e8813aa8e29fcb918bb2aa01cfb6d133d8cee"),
    ("mlx-lm", "0.32.2", "5c0991248cfff5872503d74f466d2532dd8cb7fb3670cb9be7a06d7305dadc04"),
    ("mlx-vlm", "0.7.10", "f112ddaaf1bf0dd1efa702b5675a27df3345614e69e3996d3fbd09d838b8333d"),
    ("multiprocess", "0.70.19", "928851ae7973aea4ce0eaf330bbdafb2e01398a91518d5c8818802845564f45c"),
    ("numpy", "2.4.6", "89cd468399cfd2504718f0ba50e410dca55a170b61a02ad92bb18c8a65186e93"),
    ("opencv-python", "5.0.0.93", "c8de2dec111122a02e8beb28e16c31904992dfd6186560b142a92c71403c1039"),
    ("opentelemetry-api", "1.45.2", "2cbd737377e710ee740d261c94e93fa0f08e6d037c18f17513cc0a2d94479a34"),
    ("packaging", "26.4", "81383611a09c1bc0b08b76e0fd5829d7c6824c65b27a6aee339da133f4233ea2"),
    ("pandas", "3.1.1", "4f1602f614bb83f443381dbcbb94c4ac764b2e50c8d6c965614c5cd83e328c47"),
    ("pillow", "13.0.0", "a625df9a2a5597fa5e5266e01aefc82604bb85d291e3547981e863560d75da6c"),
    ("protobuf", "7.36.2", "89f23aa53c24553a2416fd4fd1ec06f74fa42b14b546d8883128813f775bbfd2"),
    ("pyarrow", "26.0.1", "39cb0f2418282c24bea6ceda77b03e5a8f0a5766b63a8bf194d4e2a2c423548c"),
    ("pycparser", "3.12", "a076f3f489b39b43ed13563a1dafe42447445bec2e294154ec5c57fcdda4c85e"),
    ("pydantic", "2.14.4", "653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc"),
    ("pydantic-core", "2.50.5", "488319076ec92908b91fc6265ce761f1d78748f69f85518564fd16bf333e1b70"),
    ("pygments", "2.21.0", "2363c69b61c4a97c838da3b130dcd6468f4848992b21a82f2a63ec34377137d9"),
    ("python-dateutil", "4.0.0", "a5e246f79eb80475e691bf93862cead98decd8a498cf53ba0516fcdc0f50dc1c"),
    ("python-multipart", "0.0.34", "ebacd224bd686eee2f9aa1066a657affe07435a185834e05e5235e2e59173e91"),
    ("pyyaml", "6.0.4", "622aa875fa6533f25fedcffe23079357d65a690d462200afed5d8e9d0e01ebee"),
    ("regex", "2026.11.19", "86d3b2ea69b3c56df3e8ddbac6cd98eaf5a8c5b5e7e006897ebdf7a28d6818e6"),
    ("requests", "2.34.2", "2a0d60c172f83ac6ab31e4554906c0f3b3588d37b5cb939b1c061f4907e278e0"),
    ("rich", "15.0.0", "33bd4ef74232fb73fe9279a257718407f169c09b78a87ad3d296f548e27de0bb"),
    ("safetensors", "0.8.0", "fd6f3f93c9a0a7cc2788ee63fb763353d4bd2e89b0751bc78fcf7dda00bea774"),
    ("scipy", "1.17.1", "43af8d1f3bea642559019edfe64e9b11192a8978efbd1539d7bc2aaa23d92de4"),
    ("sentencepiece", "0.2.3", "141dc0bef1e28a5cf7e41c8354ad6cc14525758278045286dcb5429b9906d39f"),
    ("shellingham", "1.5.4", "7ecfff8f2fd72616f7481040475a65b2bf8af90a56c89140852d1120324e8686"),
    ("sounddevice", "0.5.6", "de099612311ad81e55d31ccbd83f43ea6bf4d87b48f9b6ea55a1fbcde0eee4e0"),
    ("starlette", "1.10.0", "478c0ab3b4ced6e82719849c118fa406f0278a3499c1a898cd15cd31bdc38ce4"),
    ("tokenizers", "0.23.3", "376851d22bcf9d650a5c3090bb83e6cf9e895fbf0595369fa4cd43c1f69b5f87"),
    ("tqdm", "4.70.1", "c293e525e6fef9c20e8728fd4612df02a0aa31bb5fe91ecd93e123b1b7bffa73"),
    ("transformers", "5.24.0", "ff5ebedf9359f94bb63772b6380eba6e7104d010cbbb2cb82c788817ea7486f6"),
    ("truststore", "0.10.5", "9aaaedaefaf06d8b206278cf8b5012bc897f485a874503501e12d776df78951c"),
    ("typer", "0.29.2", "f30731f8ca758368b836b3714872e58e395cef8fcaff918c853b1969ed5274e7"),
    ("typing-extensions", "4.16.0", "481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8"),
    ("typing-inspection", "0.4.5", "bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39"),
    ("tzdata", "2026.6", "0a10eec6e13ef16b627fabed9a5f2ba61a62b1c67f327305f4e7e412a70b4aec"),
    ("urllib3", "2.8.0", "0cf3cae568d36aa9576b28dfb35f11328f1cb974ca7647d9475ebb86c75ac6e3"),
    ("uvicorn", "0.54.0", "505bdb0f318731d45f1f712071fc781a8981f6847a31c902c9f5e652d4f67faf"),
    ("websockets", "17.4", "cebad8f4796248b91fc2168515e507e5cb6b663a32befd09f3b1e7920acdcb1a"),
    ("xxhash", "4.1.0", "5e713f5db9e1a8aafac59a45cc1ffce11ca507730f5dc12e212ea7b73d9debde"),
)
# mlx is asked for with its "cpu" extra (mlx-cpu, the Linux CPU backend, pinned above).
EXTRAS = {"mlx": "[cpu]"}
INFO_FILE = "install-info.json"
REQUIREMENTS_FILE = "requirements.txt"
INFO_MAX_BYTES = 64 * 1024      # ours is under 1 KiB; a bigger file is not ours (read bounded)
PYTHON_PROBE_SECONDS = 60


def requirements_text() -> str:
    """requirements.txt as pip installs it: one pinned line per distribution, its hash."""
    head = (f"# {PACKAGE}=={VERSION} with mlx[cpu]=={MLX}: written by tools/dspark_mlx.py "
            "(pip install --require-hashes)\n")
    return head + "".join(f"{line} --hash=sha256:{sha}\n"
                          for line, (_, _, sha) in zip(requirements(), PINS))


def requirements() -> list[str]:
    """What requirements.txt asks for, without the hashes (the roots of the closure check)."""
    return [f"{name}{EXTRAS.get(name, '')}=={version}" for name, version, _ in PINS]


def pin_versions() -> dict[str, str]:
    return {name: version for name, version, _ in PINS}


def expected_info() -> dict:
    """install-info.json of a whole install, as `install` writes it."""
    return {"package": PACKAGE, "version": VERSION, "mlx": MLX,
            "python": f"{PYTHON[0]}.{PYTHON[1]}", "platform": PLATFORM,
            "requirements_sha256": hashlib.sha256(requirements_text().encode()).hexdigest(),
            "distributions": pin_versions()}


def install_dir() -> Path:
    return cache.cache_root() / DIR_NAME


def python_path(root: Path | None = None) -> Path:
    """The engine's interpreter in an install (``--engine dspark-mlx=PYTHON``'s default)."""
    return (install_dir() if root is None else root) / "venv" / "bin" / "python"


# --- is this a whole install ---------------------------------------------------------------

def read_info(path: Path) -> dict:
    """install-info.json as a JSON object (strict: no duplicate key, no NaN)."""
    expected = f"expected the JSON object tools/dspark_mlx.py writes (at most {INFO_MAX_BYTES} bytes)"
    return cache.read_json_object(path, INFO_MAX_BYTES, expected, InstallError)


def _check_info(root: Path) -> None:
    path = root / INFO_FILE
    cache.check_info(path, read_info(path), expected_info(), InstallError)


def check_install(root: Path | None = None) -> None:
    """None when ``root`` (default: the cache's) is a whole install of the pins; else
    InstallError, one line naming the path and what was expected."""
    root = install_dir() if root is None else root
    venvs.check_dir(root, f"the directory of a {PACKAGE} {VERSION} install")
    _check_info(root)
    req = root / REQUIREMENTS_FILE
    if venvs.read_bounded(req, INFO_MAX_BYTES, "expected the pinned requirements") != \
            requirements_text().encode():
        raise InstallError(f"{cache.shown(req)}: not the pinned requirements this script "
                           "writes")
    venvs.check_dir(root / "venv", "the install's virtual environment")
    venvs.check_python(python_path(root), PYTHON, seconds=PYTHON_PROBE_SECONDS)
    site = venvs.site_packages(root, PYTHON)
    venvs.check_dir(site, "the venv's site-packages")
    venvs.check_distributions(site, PINS)


def install_problem(root: Path | None = None) -> str | None:
    """Why ``root`` is not a whole install (one line), or None where it is."""
    return venvs.problem_of(lambda: check_install(root))


def is_installed(root: Path | None = None) -> bool:
    return install_problem(root) is None


# --- installing ---------------------------------------------------------------------------

def install(*, quiet_pip: bool = True) -> Path:
    """Install into the cache unless a whole install is there (anything else there is
    replaced); returns the install directory."""
    final = install_dir()
    if is_installed(final):
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
                       f"mlx[cpu]=={MLX} and the {len(PINS) - 3} distributions they need "
                       "(about a minute)")
        venvs.remove_console_scripts(work)
        # --no-deps: pip took exactly the pins; that they are all the install needs is
        # checked here, on their own METADATA (tools/pins_closed.py).
        venvs.check_closed([venvs.site_packages(work, PYTHON)], pin_versions(), requirements())
        log.unlink()
        (work / INFO_FILE).write_text(json.dumps(expected_info(), indent=2) + "\n")
        check_install(work)             # what `path` will accept, or a failure
        return cache.put_in_place(work, final, is_installed)
    except BaseException:
        cache.remove_quietly(work)
        raise


def main(argv: list[str] | None = None) -> int:
    return venvs.venv_main(
        argv, description=__doc__.splitlines()[0], package=PACKAGE, version=VERSION,
        how="`python tools/dspark_mlx.py install` (`make dspark-mlx`)",
        install_dir=install_dir, install_problem=install_problem, python_path=python_path,
        install=install, is_installed=is_installed,
        done=lambda root, seconds: (f"{PACKAGE} {VERSION} (mlx {MLX}): {python_path(root)} "
                                      f"({seconds:.0f} s)"))


if __name__ == "__main__":
    sys.exit(main())
