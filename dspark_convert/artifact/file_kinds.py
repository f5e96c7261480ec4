"""What a GGUF file that came without a manifest is, by its metadata: a drafter file of our
format, one `dspark export` wrote, llama.cpp's converter's, Strata's tools', or no drafter
at all (docs/ENGINES.md, "Files other tools wrote"). `dspark validate FILE.gguf` and
`dspark inspect FILE.gguf` say it first, and hold only a file of our format to the format.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.artifact.format import GGUF_FILE, MANIFEST_FILE
from dspark_convert.formats.gguf_reader import GGUFFile


def is_regular_file(path: str | os.PathLike) -> bool:
    """A regular file (not a link, not a directory)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def artifact_of(path: str | os.PathLike) -> Path | None:
    """The artifact directory whose drafter.gguf ``path`` is (a manifest.json, a regular
    file, beside it), else None: a .gguf file alone, which validate and inspect read as a
    bare file. The one rule both commands use, so that they read the same file alike."""
    path = Path(path)
    if path.name == GGUF_FILE and is_regular_file(path.parent / MANIFEST_FILE):
        return path.parent
    return None


def architecture(kv: Mapping[str, object]) -> str | None:
    value = kv.get("general.architecture")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class FileKind:
    name: str
    ours: bool                                    # held to our format, as an artifact's file
    matches: Callable[[Mapping[str, object]], bool]
    what: str                                     # the check's detail; {arch} is filled in

    def describe(self, gguf: GGUFFile) -> str:
        arch = architecture({key: entry.value for key, entry in gguf.kv.items()})
        return self.what.format(arch=repr(arch) if arch else "missing")


# What a bare file is, by its metadata: the first row that matches.
FILE_KINDS: tuple[FileKind, ...] = (
    FileKind("dspark", True, lambda kv: "dspark.format_version" in kv,
             "a drafter file of our format (dspark.format_version), held to "
             "docs/ARTIFACT_FORMAT.md as an artifact's drafter.gguf is"),
    FileKind("dspark-export", False, lambda kv: "dspark.export.engine" in kv,
             "a drafter file `dspark export --engine llama.cpp` wrote: llama.cpp's layout, "
             "not our format"),
    FileKind("llama.cpp", False,
             lambda kv: architecture(kv) == "dflash" and "dflash.context_length" in kv,
             "a DFlash/DSpark/DFlash2 drafter file in llama.cpp's layout (its convert_hf_to_gguf.py "
             "writes dflash.context_length and the target's tokenizer): not our format"),
    FileKind("llama.cpp-assistant", False,
             lambda kv: architecture(kv) == "gemma4-assistant" and "dspark.format_version" not in kv,
             "a Gemma 4 assistant file in llama.cpp's layout (its Gemma4AssistantModel "
             "converter writes these): not our format, no dspark.format_version"),
    FileKind("strata", False, lambda kv: architecture(kv) == "dflash",
             "a DFlash drafter file in Strata's layout (its tools/dflash_gguf.py and "
             "tools/dflash_quantize.py write these): not our format, no dspark.format_version"),
    FileKind("other", False, lambda kv: True,
             "not a DFlash/DSpark drafter file: general.architecture is {arch}"),
)


def file_kind(gguf: GGUFFile) -> FileKind:
    values = {key: entry.value for key, entry in gguf.kv.items()}
    return next(kind for kind in FILE_KINDS if kind.matches(values))


