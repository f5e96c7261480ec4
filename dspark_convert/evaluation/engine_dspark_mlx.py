"""dspark-mlx's own runs, read back as data: the engine `dspark eval --engine dspark-mlx` puts
beside the reference runtime and llama.cpp (docs/ENGINES.md "dspark-mlx").

dspark-mlx 0.1.0 is a Python library (no program to run on a prompt of token ids), so the
eval runs a short script of its own, ``RUNNER`` below, in dspark-mlx's interpreter (the venv
tools/dspark_mlx.py installs, or ``--engine dspark-mlx=PYTHON``), as a user of the library
writes it, calling only what dspark-mlx exports (read in its sdist, never copied):

- ``load_draft(DIR)``: the drafter from a DeepSpec-layout checkpoint (config.json +
  safetensors); its backbone picked by ``config["model_type"]`` from ``ARCH_REGISTRY``;
- ``load_host(TARGET, config)``: the target through its host, mlx-vlm for a drafter whose
  model_type starts with ``gemma4`` (the gemma4_unified text tower), mlx-lm otherwise;
- ``generate_eager(adapter, drafter, [ids], max_new_tokens, eos_id=None)``: its reference-
  matched loop, greedy (``greedy_accept``), the confidence head advisory (threshold 0);
- the target alone: the host adapter's ``prefill`` and ``decode_step`` with the argmax of
  each step's logits, dspark-mlx's own baseline (its ``bench`` command's).

Every draft is recorded where dspark-mlx makes it: the drafter's ``draft(anchor)`` and
``extend_context(hiddens)`` are wrapped on the instance (the arguments and the result
passed on unchanged), so each record says how many committed positions the drafter held,
the anchor and the whole block it proposed; each emitted token comes with the cycle's
accepted count (``TokenEvent``). The records go to a pipe of their own (the runner's
``--records`` fd), one JSON object a line; dspark-mlx's, MLX's and the hosts' own output
(stdout, stderr) is only kept for a message (its last lines).

The records are hostile input as much as llama.cpp's log:

- read as they come, bounded: a record at most ``LINE_LIMIT`` bytes, all of them at most
  what the prompts and max_new_tokens allow (``records_limit``), the engine's own output at
  most ``OUTPUT_LIMIT`` (only its last lines kept);
- strict JSON (no duplicate key, no NaN), each kind with exactly its keys and types (an
  integer is never a bool or a float), in the order the runner writes them;
- every field range-checked (token ids inside the target's vocabulary, a block of the
  artifact's size, counts within the run) and cross-checked: the committed positions the
  drafter held at each draft equal the tokens the cycles read commit (llama.cpp's ``hist
  size`` check), each cycle's tokens are its accepted drafts and one more, the summary's
  counts are the cycles'.

Whatever is missing, malformed or contradicts itself is refused with ``MlxOutputError``
(116) naming the run and the record; a run that exits non-zero, dies by a signal or runs
past its time is ``MlxRunError`` (115) naming the run, the command and the engine's last
lines (a Python traceback's last line names the exception). dspark-mlx's own refusal to
load a drafter or a target (its exception, raised while loading) is not a failure of the
run: it is recorded as such (``Refused``), and the eval lists the run in ``not_run`` with
that reason. An interpreter that is not an install of the pinned versions is
``MlxInstallError`` (114).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.errors import MlxInstallError, MlxOutputError, MlxRunError
from dspark_convert.evaluation.engine_process import Abandoned, Watched, signal_name
from dspark_convert.util.strict_json import json_error_text, loads_strict
from dspark_convert.util.text import shown

ENGINE = "dspark-mlx"
# The versions this module's reading is of (tools/dspark_mlx.py pins them, with everything
# they need): another dspark-mlx or mlx is refused (114), not read as if it were these.
DSPARK_MLX = "0.1.0"
MLX = "0.32.4"
# Where tools/dspark_mlx.py installs them (its install_dir()/venv/bin/python; a test keeps
# the two in step).
INSTALL_DIR = f"{ENGINE}-{DSPARK_MLX}"

TIMEOUT_SECONDS = 600
PROBE_SECONDS = 120
LINE_LIMIT = 1 << 20                 # one record (a target's output is its longest)
OUTPUT_LIMIT = 64 << 20              # the engine's own stdout and stderr, together
TAIL = 20                            # lines of the engine's own output kept for a message
CHUNK = 1 << 16
RECORD_BASE = 1 << 20                # the engine and loaded records, with slack
# The most bytes one record of a cycle takes: its keys, a prompt index, counts and ids of
# at most 10 digits (the runner writes them compactly).
RECORD_BYTES = 256
ID_BYTES = 11
GRACE_SECONDS = 5.0                  # a run whose records were refused, let end first


def default_python() -> Path:
    """The interpreter tools/dspark_mlx.py installs (``make dspark-mlx``): in
    $DSPARK_ENGINE_CACHE (default ~/.cache/dspark-convert)/dspark-mlx-0.1.0/venv/bin/."""
    cache = os.environ.get("DSPARK_ENGINE_CACHE") or Path.home() / ".cache" / "dspark-convert"
    return Path(cache) / INSTALL_DIR / "venv" / "bin" / "python"


def find_python(given: str | os.PathLike | None) -> Path:
    """``--engine dspark-mlx=PYTHON``'s interpreter (default: the cache's): an executable
    file, or MlxInstallError naming it and how to install one."""
    path = Path(given) if given is not None else default_python()
    label = f"--engine {ENGINE}" + (f"={shown(str(given))}" if given is not None else "")
    where = "" if given is not None else " (the default: the install of `make dspark-mlx`)"
    if not path.exists():
        raise MlxInstallError(f"{label}: {shown(str(path))} does not exist{where}; expected "
                              f"dspark-mlx's Python interpreter (`make dspark-mlx` installs "
                              f"{ENGINE} {DSPARK_MLX} with mlx {MLX})", path=str(path),
                              expected="an executable file", found="missing")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise MlxInstallError(f"{label}: {shown(str(path))} is not an executable file{where}; "
                              "expected dspark-mlx's Python interpreter", path=str(path),
                              expected="an executable file", found="not executable")
    return path.absolute()


# --- the runner: the script run in dspark-mlx's interpreter -----------------------------------

RUNNER = r'''
"""Run by `dspark eval --engine dspark-mlx` in dspark-mlx's interpreter (dspark_convert/
evaluation/engine_dspark_mlx.py writes it): dspark-mlx's exported API only, every draft
recorded as it is made, one JSON object a line on the records fd."""
import importlib.metadata as metadata
import json
import os
import struct
import sys
import time
import traceback

request = json.loads(open(sys.argv[1], encoding="utf-8").read())
records = os.fdopen(int(sys.argv[2]), "w", buffering=1, encoding="utf-8")
quiet = False


def put(kind, **fields):
    if not quiet:
        records.write(json.dumps({"kind": kind, **fields}, separators=(",", ":"),
                                 allow_nan=False) + "\n")


def refused(stage, exc):
    """dspark-mlx (or its host) refusing to load: its own exception, where it was raised."""
    def at(f):
        return f"{f.filename.replace(os.sep, '/').split('/site-packages/')[-1]}:{f.lineno} {f.name}"

    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "/dspark_mlx/" in f.filename.replace(os.sep, "/")]
    where = at(frames[-1]) if frames else ""
    if own and own[-1] is not frames[-1]:
        where += f", called from {at(own[-1])}"
    put("refused", stage=stage, error=type(exc).__name__, message=str(exc)[:2000], where=where)
    put("end")
    sys.exit(0)


import mlx.core as mx
import numpy as np
import dspark_mlx
from dspark_mlx import ARCH_REGISTRY, generate_eager, load_draft, load_host, resolve_arch
from dspark_mlx.events import SummaryEvent, TokenEvent

put("engine", dspark_mlx=dspark_mlx.__version__, mlx=metadata.version("mlx"),
    mlx_lm=metadata.version("mlx-lm"), mlx_vlm=metadata.version("mlx-vlm"),
    python=sys.version.split()[0], device=str(mx.default_device()),
    backbones={a.name: list(a.model_types) for a in ARCH_REGISTRY})
mode = request["mode"]
if mode == "probe":
    put("end")
    sys.exit(0)

prompts, n = request["prompts"], request["max_new_tokens"]


def greedy(adapter, ids, count):
    """The target alone: the host's prefill, then one decode_step a token, each the argmax
    of its logits (dspark-mlx's own baseline)."""
    adapter.reset()
    step = adapter.prefill(mx.array([ids], dtype=mx.int32))
    out = [int(mx.argmax(step.logits[0].astype(mx.float32)).item())]
    while len(out) < count:
        step = adapter.decode_step(mx.array([out[-1]], dtype=mx.int32))
        out.append(int(mx.argmax(step.logits[0].astype(mx.float32)).item()))
    return out


if mode == "target":
    config = json.loads(open(request["config"], encoding="utf-8").read())
    try:
        model, tokenizer, adapter = load_host(request["target"], config)
    except Exception as exc:
        refused("host", exc)
    put("loaded", host=type(adapter).__name__)
    quiet = True
    greedy(adapter, prompts[0], min(n, 8))                       # warm-up, untimed
    quiet = False
    for i, ids in enumerate(prompts):
        t0 = time.perf_counter()
        out = greedy(adapter, ids, n)
        put("target", prompt=i, tokens=out, seconds=time.perf_counter() - t0)
    put("end")
    sys.exit(0)

# mode == "drafter"
checkpoint = request["checkpoint"]
try:
    drafter, config = load_draft(checkpoint)
except Exception as exc:
    refused("drafter", exc)
arch = resolve_arch(config)


def checkpoint_keys(directory):
    keys = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            with open(os.path.join(directory, name), "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                keys += [k for k in json.loads(fh.read(size)) if k != "__metadata__"]
    return keys


from mlx.utils import tree_flatten
built = [name for name, _ in tree_flatten(drafter.parameters())]
mapped = {arch.key_map(k) for k in checkpoint_keys(checkpoint)} - {None}
try:
    model, tokenizer, adapter = load_host(request["target"], config)
except Exception as exc:
    refused("host", exc)
put("loaded", backbone=arch.name, host=type(adapter).__name__, block_size=int(drafter.block_size),
    temperature=float(drafter.temperature), parameters=len(built),
    random=sorted(set(built) - mapped))

committed = [0]
extend_context, draft, reset = drafter.extend_context, drafter.draft, drafter.reset
current = [0]


def recorded_reset():
    committed[0] = 0
    return reset()


def recorded_extend(hiddens):
    committed[0] += int(hiddens.shape[1])
    return extend_context(hiddens)


def recorded_draft(anchor):
    out = draft(anchor)
    block = np.array(out[0])
    put("draft", prompt=current[0], context=committed[0],
        anchor=int(np.array(anchor).reshape(-1)[0]), tokens=[int(t) for t in block[0, 1:]])
    return out


drafter.reset, drafter.extend_context, drafter.draft = recorded_reset, recorded_extend, recorded_draft


def run(ids, count):
    adapter.reset()
    drafter.reset()
    for event in generate_eager(adapter, drafter, [ids], max_new_tokens=count, eos_id=None):
        if isinstance(event, TokenEvent):
            put("token", prompt=current[0], token=int(event.token), accepted=int(event.n_accepted))
        elif isinstance(event, SummaryEvent):
            put("summary", prompt=current[0], emitted=int(event.n_emitted),
                drafted=int(event.n_drafted), accepted=int(event.n_accepted))


quiet = True
run(prompts[0], min(n, 8))                                        # warm-up, untimed
quiet = False
for i, ids in enumerate(prompts):
    current[0] = i
    t0 = time.perf_counter()
    run(ids, n)
    put("done", prompt=i, seconds=time.perf_counter() - t0)
put("end")
'''


# --- what a run gives ------------------------------------------------------------------------

@dataclass(frozen=True)
class EngineVersion:
    """The ``engine`` record: what the interpreter runs."""

    dspark_mlx: str
    mlx: str
    mlx_lm: str
    mlx_vlm: str
    python: str
    device: str
    backbones: dict[str, tuple[str, ...]]     # dspark-mlx's ARCH_REGISTRY: name -> model types

    @property
    def line(self) -> str:
        """One line for the report (as llama.cpp's system_info line is kept)."""
        return (f"dspark-mlx {self.dspark_mlx}, mlx {self.mlx} ({self.device}), mlx-lm "
                f"{self.mlx_lm}, mlx-vlm {self.mlx_vlm}, Python {self.python}")


@dataclass(frozen=True)
class Refused:
    """dspark-mlx's own refusal to load (its exception while loading the drafter or the
    target's host), and where it was raised."""

    stage: str                         # "drafter" or "host"
    error: str                         # the exception's type
    message: str
    where: str                         # file:line function, under site-packages

    @property
    def reason(self) -> str:
        what = ("dspark-mlx's load_draft refuses the drafter" if self.stage == "drafter"
                else "dspark-mlx's host (load_host) refuses the target")
        at = f" (raised at {self.where})" if self.where else ""
        return f"{what}: {self.error}: {self.message}{at}"


@dataclass(frozen=True)
class TargetOutput:
    tokens: tuple[int, ...]            # max_new_tokens greedy tokens (no stop: eos_id None)
    seconds: float


@dataclass(frozen=True)
class TargetRun:
    version: EngineVersion
    host: str
    outputs: tuple[TargetOutput, ...]  # one a prompt, in order
    seconds: float                     # the whole process


@dataclass(frozen=True)
class Cycle:
    """One draft dspark-mlx made and its verification."""

    call: int                          # 1, 2, ... within the prompt
    context: tuple[int, ...]           # committed tokens before the anchor
    anchor: int
    tokens: tuple[int, ...]            # the block it proposed after the anchor
    accepted: int                      # its accepted drafts (the engine's count)
    emitted: tuple[int, ...]           # what the cycle emitted (cut by max_new_tokens)


@dataclass(frozen=True)
class PromptRun:
    cycles: tuple[Cycle, ...]
    output: tuple[int, ...]            # every token emitted, in order
    seconds: float


@dataclass(frozen=True)
class Loaded:
    backbone: str                      # the ARCH_REGISTRY entry load_draft picked
    host: str                          # the adapter class load_host built
    block_size: int
    parameters: int                    # the drafter's parameters dspark-mlx built
    random: tuple[str, ...]            # of them, those no checkpoint key maps to: left at
                                       # their random initialisation (it checks nothing else)


@dataclass(frozen=True)
class DrafterRun:
    version: EngineVersion
    loaded: Loaded
    prompts: tuple[PromptRun, ...]
    seconds: float                     # the whole process


# --- reading the records ---------------------------------------------------------------------

def records_limit(prompts, *, max_new_tokens: int, block_size: int) -> int:
    """The most bytes of records a run of these prompts may write: the fixed records, then
    a prompt's target output, or its cycles (at most one a token, and the warm-up is not
    recorded), each draft's ids and each token's record."""
    per_prompt = (RECORD_BYTES * 4 + max_new_tokens * ID_BYTES
                  + (max_new_tokens + 1) * (2 * RECORD_BYTES + block_size * ID_BYTES))
    return RECORD_BASE + len(prompts) * per_prompt


class _Records:
    """The records pipe, a line at a time: bounded, strict JSON objects, each numbered."""

    def __init__(self, read, *, run: str, limit: int) -> None:
        self._read, self.run, self.limit = read, run, limit
        self._buf = bytearray()
        self._eof = False
        self.total = 0
        self.count = 0

    def fail(self, what: str, expected: str, *, field: str | None = None,
             found: object = None) -> MlxOutputError:
        at = f"record {self.count}" if self.count else "its records"
        return MlxOutputError(f"{ENGINE} ({self.run}): {at}: {what}; expected {expected}",
                              path=ENGINE, field=field or f"record {self.count}",
                              expected=expected, found=found)

    def next(self) -> dict | None:
        """The next record, or None at the end of the pipe."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[:nl + 1]
                break
            if len(self._buf) > LINE_LIMIT:
                self.count += 1
                raise self.fail(f"a record longer than {LINE_LIMIT:,} bytes",
                                 "one JSON object a line, each far shorter")
            chunk = b"" if self._eof else self._read(CHUNK)
            if not chunk:
                self._eof = True
                if self._buf:
                    self.count += 1
                    raise self.fail("a last record without its newline",
                                    "every record ended by a newline")
                return None
            self.total += len(chunk)
            if self.total > self.limit:
                raise self.fail(f"more than {self.limit:,} bytes of records (the most these "
                                "prompts and max_new_tokens make)", f"at most {self.limit} "
                                "bytes", field="records", found=f"more than {self.limit}")
            self._buf += chunk
        self.count += 1
        if len(line) > LINE_LIMIT:
            raise self.fail(f"a record longer than {LINE_LIMIT:,} bytes",
                            "one JSON object a line, each far shorter")
        try:
            record = loads_strict(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise self.fail("not UTF-8", "one JSON object a line") from None
        except (ValueError, RecursionError) as exc:
            raise self.fail(f"not JSON ({json_error_text(exc)})", "one JSON object a line") \
                from None
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            raise self.fail("not a JSON object with a 'kind'", "one JSON object a line")
        return record


# Each kind's keys and the type of each value (an int is never a bool; a number is an int
# or a float, finite; a list of ids is a list of ints).
_INT, _NUM, _STR, _IDS, _NAMES, _TYPES = "int", "number", "str", "ids", "names", "types"
KINDS: dict[str, dict[str, str]] = {
    "engine": {"dspark_mlx": _STR, "mlx": _STR, "mlx_lm": _STR, "mlx_vlm": _STR, "python": _STR,
               "device": _STR, "backbones": _TYPES},
    "refused": {"stage": _STR, "error": _STR, "message": _STR, "where": _STR},
    "loaded": {"backbone": _STR, "host": _STR, "block_size": _INT, "temperature": _NUM,
               "parameters": _INT, "random": _NAMES},
    "target": {"prompt": _INT, "tokens": _IDS, "seconds": _NUM},
    "draft": {"prompt": _INT, "context": _INT, "anchor": _INT, "tokens": _IDS},
    "token": {"prompt": _INT, "token": _INT, "accepted": _INT},
    "summary": {"prompt": _INT, "emitted": _INT, "drafted": _INT, "accepted": _INT},
    "done": {"prompt": _INT, "seconds": _NUM},
    "end": {},
}
TARGET_LOADED = ("host",)             # the target alone's loaded record holds the host only
TEXT_LIMIT = 4000                     # a string field's most characters
NAMES_LIMIT = 100_000                 # parameters named in ``random``


def _typed(rec: _Records, record: dict, expect: tuple[str, ...]) -> dict:
    kind = record["kind"]
    if kind not in expect:
        raise rec.fail(f"a {shown(kind)[:40]!r} record", " or ".join(repr(k) for k in expect),
                       found=shown(kind)[:40])
    spec = dict(KINDS[kind])
    if kind == "loaded" and set(record) == {"kind", *TARGET_LOADED}:
        spec = {k: spec[k] for k in TARGET_LOADED}
    if set(record) != {"kind", *spec}:
        raise rec.fail(f"a {kind} record with the keys {sorted(set(record) - {'kind'})}",
                       f"exactly {sorted(spec)}")
    for key, kind_of in spec.items():
        value = record[key]
        ok = {_INT: lambda v: type(v) is int and abs(v) < 1 << 40,
              _NUM: lambda v: type(v) in (int, float) and math.isfinite(v),
              _STR: lambda v: type(v) is str and len(v) <= TEXT_LIMIT,
              _IDS: lambda v: type(v) is list and all(type(x) is int for x in v),
              _NAMES: lambda v: type(v) is list and len(v) <= NAMES_LIMIT
              and all(type(x) is str and len(x) <= 400 for x in v),
              _TYPES: lambda v: type(v) is dict and len(v) <= 64 and all(
                  type(k) is str and len(k) <= 64 and type(t) is list and len(t) <= 64
                  and all(type(x) is str and len(x) <= 64 for x in t) for k, t in v.items()),
              }[kind_of](value)
        if not ok:
            raise rec.fail(f"its {key} is {shown(json.dumps(value))[:80]}",
                           f"{'an integer' if kind_of == _INT else kind_of}",
                           field=f"record {rec.count}.{key}")
    return record


def _version(rec: _Records, record: dict) -> EngineVersion:
    v = EngineVersion(dspark_mlx=record["dspark_mlx"], mlx=record["mlx"],
                      mlx_lm=record["mlx_lm"], mlx_vlm=record["mlx_vlm"],
                      python=record["python"], device=record["device"],
                      backbones={k: tuple(t) for k, t in record["backbones"].items()})
    for name, got, want in (("dspark-mlx", v.dspark_mlx, DSPARK_MLX), ("mlx", v.mlx, MLX)):
        if got != want:
            raise MlxInstallError(f"--engine {ENGINE}: the interpreter runs {name} "
                                  f"{shown(got)[:40]}; the eval reads {name} {want}'s runs "
                                  f"(`make dspark-mlx` installs {ENGINE} {DSPARK_MLX} with mlx "
                                  f"{MLX})", path=ENGINE, field=name, expected=want,
                                  found=shown(got)[:40])
    return v


def _id(rec: _Records, value: int, vocab_size: int, what: str, field: str) -> int:
    if not 0 <= value < vocab_size:
        raise rec.fail(f"{what} {value}", f"a token id in [0, {vocab_size}) (the target's "
                       "vocabulary)", field=field, found=value)
    return value


def _seconds(rec: _Records, value: float, wall: Callable[[], float] | None, field: str) -> float:
    """A time the runner measured: at most the time the process has run when it is read
    (``wall()``; a second of clock slack): a longer one is a garbled record."""
    if value < 0 or (wall is not None and value > wall() + 1.0):
        raise rec.fail(f"a time of {value} s", "a time within the run", field=field,
                       found=value)
    return float(value)


def read_probe(rec: _Records) -> EngineVersion:
    version = _version(rec, _typed(rec, _first(rec), ("engine",)))
    _end(rec)
    return version


def _first(rec: _Records) -> dict:
    record = rec.next()
    if record is None:
        raise rec.fail("no record", "the runner's records, the engine record first")
    return record


def _next(rec: _Records, expect: tuple[str, ...]) -> dict:
    record = rec.next()
    if record is None:
        raise rec.fail("its records end before the end record",
                       "every record up to the end record", found="cut")
    return _typed(rec, record, expect)


def _end(rec: _Records) -> None:
    _next(rec, ("end",))
    if rec.next() is not None:
        raise rec.fail("a record after the end record", "nothing after it")


def _refused(record: dict) -> Refused:
    return Refused(stage=record["stage"], error=record["error"], message=record["message"],
                   where=record["where"])


def read_target(rec: _Records, prompts, *, vocab_size: int, max_new_tokens: int,
                wall: Callable[[], float] | None = None) -> tuple[EngineVersion, str, list[TargetOutput]] | Refused:
    """The target alone's records: engine, loaded (or refused), one target record a prompt
    of exactly max_new_tokens ids, end."""
    version = _version(rec, _typed(rec, _first(rec), ("engine",)))
    record = _next(rec, ("loaded", "refused"))
    if record["kind"] == "refused":
        refusal = _refused(record)
        if refusal.stage != "host":
            raise rec.fail(f"a refusal at stage {shown(refusal.stage)!r}", "'host'")
        _end(rec)
        return refusal
    if set(record) != {"kind", *TARGET_LOADED}:
        raise rec.fail("a drafter's loaded record", "the target's: its host only")
    host = record["host"]
    outputs = []
    for i, _ in enumerate(prompts):
        r = _next(rec, ("target",))
        if r["prompt"] != i:
            raise rec.fail(f"prompt {r['prompt']}", f"prompt {i}", field=f"record {rec.count}.prompt")
        if len(r["tokens"]) != max_new_tokens:
            raise rec.fail(f"{len(r['tokens'])} tokens", f"{max_new_tokens} (max_new_tokens; "
                           "no stop token is given to it)", field=f"record {rec.count}.tokens")
        tokens = tuple(_id(rec, t, vocab_size, "token", f"record {rec.count}.tokens")
                       for t in r["tokens"])
        outputs.append(TargetOutput(tokens, _seconds(rec, r["seconds"], wall,
                                                     f"record {rec.count}.seconds")))
    _end(rec)
    return version, host, outputs


def read_drafter(rec: _Records, prompts, *, vocab_size: int, block_size: int,
                 max_new_tokens: int, wall: Callable[[], float] | None = None
                 ) -> tuple[EngineVersion, Loaded, list[PromptRun]] | Refused:
    """A drafter's records: engine, loaded (or refused), then per prompt its cycles (a draft
    and the tokens it emitted), its summary and done, then end; rebuilt and cross-checked as
    the module docstring says."""
    version = _version(rec, _typed(rec, _first(rec), ("engine",)))
    record = _next(rec, ("loaded", "refused"))
    if record["kind"] == "refused":
        _end(rec)
        return _refused(record)
    if set(record) == {"kind", *TARGET_LOADED}:
        raise rec.fail("the target alone's loaded record", "the drafter's")
    if record["block_size"] != block_size:
        raise rec.fail(f"dspark-mlx built a block of {record['block_size']}",
                       f"the artifact's block size {block_size}", field="block_size",
                       found=record["block_size"])
    if record["temperature"] != 0:
        raise rec.fail(f"its drafter samples at temperature {record['temperature']}",
                       "0 (greedy drafts; the check is greedy)", field="temperature",
                       found=record["temperature"])
    if not 0 < record["parameters"] < 1 << 20 or len(record["random"]) > record["parameters"]:
        raise rec.fail(f"{record['parameters']} parameters, {len(record['random'])} of them "
                       "random", "a count of the drafter's parameters", field="parameters")
    loaded = Loaded(backbone=record["backbone"], host=record["host"], block_size=block_size,
                    parameters=record["parameters"], random=tuple(record["random"]))
    runs = [_read_prompt(rec, i, list(p), vocab_size=vocab_size, block_size=block_size,
                         max_new_tokens=max_new_tokens, wall=wall)
            for i, p in enumerate(prompts)]
    _end(rec)
    return version, loaded, runs


def _read_prompt(rec: _Records, index: int, prompt: list[int], *, vocab_size: int,
                 block_size: int, max_new_tokens: int, wall: Callable[[], float] | None) -> PromptRun:
    committed = list(prompt[:-1])          # generate_eager's first anchor: the last prompt token
    anchor = prompt[-1]
    output: list[int] = []
    cycles: list[Cycle] = []
    pending = None                          # the draft being verified: (record no., draft)
    emitted: list[int] = []
    accepted = None

    def close() -> None:
        nonlocal pending, emitted, accepted, anchor
        if pending is None:
            return
        number, d = pending
        if not emitted:
            raise rec.fail(f"draft {len(cycles) + 1} of prompt {index} (record {number}) "
                           "emitted no token", "the accepted drafts and one more token",
                           field=f"record {number}")
        whole = len(emitted) == accepted + 1
        want = list(d["tokens"][:accepted]) + [emitted[-1]] if whole \
            else list(d["tokens"][:len(emitted)])
        # A cycle emits its accepted drafts and the target's token, unless max_new_tokens
        # cuts it: then it is the last.
        if emitted != want or len(emitted) > accepted + 1 or \
                (not whole and len(output) + len(emitted) != max_new_tokens):
            raise rec.fail(f"draft {len(cycles) + 1} of prompt {index} accepted {accepted} of "
                           f"{d['tokens']} and emitted {emitted}", "its accepted drafts, then "
                           "the target's token (or their first tokens, at max_new_tokens)",
                           field=f"record {number}")
        cycles.append(Cycle(call=len(cycles) + 1, context=tuple(committed), anchor=anchor,
                            tokens=tuple(d["tokens"]), accepted=accepted,
                            emitted=tuple(emitted)))
        output.extend(emitted)
        committed.append(anchor)
        committed.extend(d["tokens"][:accepted])
        anchor = emitted[-1]
        pending, emitted, accepted = None, [], None

    while True:
        r = _next(rec, ("draft", "token", "summary"))
        if r["prompt"] != index:
            raise rec.fail(f"prompt {r['prompt']}", f"prompt {index}",
                           field=f"record {rec.count}.prompt")
        if r["kind"] == "summary":
            close()
            break
        if r["kind"] == "draft":
            close()
            if len(output) >= max_new_tokens:
                raise rec.fail(f"a draft after {len(output)} tokens", f"none after "
                               f"max_new_tokens ({max_new_tokens})")
            where = f"record {rec.count}"
            if r["context"] != len(committed):
                raise rec.fail(f"draft {len(cycles) + 1} of prompt {index} was made from "
                               f"{r['context']} committed positions; the tokens read so far "
                               f"commit {len(committed)}", f"{len(committed)}",
                               field=f"{where}.context", found=r["context"])
            if _id(rec, r["anchor"], vocab_size, "anchor", f"{where}.anchor") != anchor:
                raise rec.fail(f"draft {len(cycles) + 1} of prompt {index} is anchored at "
                               f"{r['anchor']}", f"{anchor}, the last token committed",
                               field=f"{where}.anchor", found=r["anchor"])
            if len(r["tokens"]) != block_size:
                raise rec.fail(f"a draft of {len(r['tokens'])} tokens",
                               f"the block of {block_size}", field=f"{where}.tokens",
                               found=len(r["tokens"]))
            for t in r["tokens"]:
                _id(rec, t, vocab_size, "a draft token", f"{where}.tokens")
            pending = (rec.count, r)
            continue
        # a token
        if pending is None:
            raise rec.fail(f"a token of prompt {index} before any draft",
                           "a draft, then the tokens its verification emitted")
        if not 0 <= r["accepted"] <= block_size or (accepted is not None
                                                    and r["accepted"] != accepted):
            raise rec.fail(f"accepted {r['accepted']}", f"one count a cycle, in [0, {block_size}]",
                           field=f"record {rec.count}.accepted", found=r["accepted"])
        accepted = r["accepted"]
        emitted.append(_id(rec, r["token"], vocab_size, "token", f"record {rec.count}.token"))
        if len(output) + len(emitted) > max_new_tokens:
            raise rec.fail(f"more than {max_new_tokens} tokens", "max_new_tokens at most",
                           field=f"record {rec.count}")
    summary = r
    want = {"emitted": len(output), "drafted": sum(len(c.tokens) for c in cycles),
            "accepted": sum(c.accepted for c in cycles)}
    for key, value in want.items():
        if summary[key] != value:
            raise rec.fail(f"its summary says {key} {summary[key]}", f"{value}, what its cycles "
                           "read make", field=f"record {rec.count}.{key}", found=summary[key])
    if len(output) != max_new_tokens:
        raise rec.fail(f"prompt {index} emitted {len(output)} tokens",
                       f"{max_new_tokens} (max_new_tokens; no stop token is given to it)")
    done = _next(rec, ("done",))
    if done["prompt"] != index:
        raise rec.fail(f"prompt {done['prompt']}", f"prompt {index}",
                       field=f"record {rec.count}.prompt")
    return PromptRun(cycles=tuple(cycles), output=tuple(output),
                     seconds=_seconds(rec, done["seconds"], wall, f"record {rec.count}.seconds"))


# --- running ------------------------------------------------------------------------------------

def _command(cmd: list[str]) -> str:
    text = " ".join(shlex.quote(a) for a in cmd)
    return text if len(text) <= 600 else text[:600] + "…"


def environment() -> dict[str, str]:
    """The engine's environment: ours, offline (every file it reads is local; a Hub lookup
    would be a silent download), no Python variable of ours leaking in (-I ignores them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    return env


def _run(python: Path, request: dict, what: str, parse, *, limit: int, timeout: float):
    """The runner in ``python`` with ``request``; its records read by ``parse(records,
    wall)`` as they come; its own output drained by a thread (its last lines kept); the run
    ended within ``timeout`` whatever it starts (evaluation/engine_process.py: its session
    killed at the deadline, and once it exits), and stopped past a limit or on a refused
    record."""
    with tempfile.TemporaryDirectory(prefix="dspark-mlx-") as tmp:
        script = Path(tmp) / "dspark_mlx_run.py"
        script.write_text(RUNNER, encoding="utf-8")
        req = Path(tmp) / "request.json"
        req.write_text(json.dumps(request), encoding="utf-8")
        r_fd, w_fd = os.pipe()
        cmd = [str(python), "-I", "-B", str(script), str(req), str(w_fd)]
        try:
            run = Watched(cmd, timeout=timeout, fds=(r_fd,), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(w_fd,),
                          env=environment(), cwd=tmp)
        except OSError as exc:
            os.close(r_fd)
            os.close(w_fd)
            raise MlxInstallError(f"--engine {ENGINE}: {shown(str(python))} cannot run: "
                                  f"{os.strerror(exc.errno or 0) or exc}", path=str(python)) \
                from None
        os.close(w_fd)
        proc = run.proc
        tail: deque[str] = deque(maxlen=TAIL)
        over = threading.Event()
        output = run.pipe(proc.stdout.fileno())
        records = run.pipe(r_fd)

        def drain() -> None:
            total, part = 0, b""
            try:
                while chunk := output(CHUNK):
                    total += len(chunk)
                    if total > OUTPUT_LIMIT:
                        over.set()
                        run.stop()
                        return
                    lines = (part + chunk).split(b"\n")
                    part = lines.pop()[-4096:]
                    for line in lines[-TAIL:]:
                        if line.strip():
                            tail.append(shown(line[:400].decode("utf-8", "replace")))
            except Abandoned:
                pass
            if part.strip():
                tail.append(shown(part[:400].decode("utf-8", "replace")))

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        rec = _Records(records, run=what, limit=limit)
        error: Exception | None = None
        parsed = None
        try:
            parsed = parse(rec, lambda: run.seconds)
        except Abandoned:
            pass                        # the run ended; its marks say how
        except (MlxOutputError, MlxInstallError) as exc:
            error = exc
            # Records cut short are most often a run that died: it is let end on its own
            # (and its exit named, 115) before being stopped for the refusal.
            try:
                proc.wait(timeout=GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                run.stop()
        except BaseException:
            run.stop()                  # Ctrl-C or a bug: the process must not outlive it
            raise
        finally:
            code = run.finish(reader)
            os.close(r_fd)
        seconds = run.seconds
    last = " | ".join(list(tail)[-5:]) or "no output"
    if run.timed_out.is_set():
        raise MlxRunError(f"{ENGINE} ({what}): {run.timeout_text()}; its last lines: {last}",
                          path=str(python), field=what, expected=f"done within {timeout:g} s",
                          found="timeout")
    if over.is_set():
        raise MlxOutputError(f"{ENGINE} ({what}): its own output exceeds {OUTPUT_LIMIT:,} bytes; "
                             "refused rather than read on", path=str(python), field="output",
                             expected=f"at most {OUTPUT_LIMIT} bytes",
                             found=f"more than {OUTPUT_LIMIT}")
    if code != 0 and not run.stopped.is_set():
        how = f"killed by {signal_name(code)}" if code < 0 else f"exit {code}"
        raise MlxRunError(f"{ENGINE} ({what}) failed, {how}; command: {_command(cmd)}; its last "
                          f"lines: {last}", path=str(python), field=what, expected="exit 0",
                          found=signal_name(code) if code < 0 else code)
    if run.orphaned.is_set():
        raise MlxRunError(f"{ENGINE} ({what}): {run.orphan_text('its records or its output')}; "
                          f"its last lines: {last}", path=str(python), field=what,
                          expected="its pipes closed when it exits",
                          found="a process it started holding its pipes")
    if error is not None:
        raise error
    return parsed, seconds


def probe(python: Path, *, timeout: float = PROBE_SECONDS) -> EngineVersion:
    """What ``python`` runs (114 unless dspark-mlx 0.1.0 with mlx 0.32.4: an interpreter
    that cannot import them, or says nothing of them, is not dspark-mlx's)."""
    try:
        version, _ = _run(python, {"mode": "probe"}, "probe", lambda rec, wall: read_probe(rec),
                          limit=RECORD_BASE, timeout=timeout)
    except (MlxRunError, MlxOutputError) as exc:
        raise MlxInstallError(f"--engine {ENGINE}={shown(str(python))}: not dspark-mlx's "
                              f"interpreter ({exc.message}); expected one that runs {ENGINE} "
                              f"{DSPARK_MLX} with mlx {MLX} (`make dspark-mlx` installs them)",
                              path=str(python), expected=f"{ENGINE} {DSPARK_MLX}",
                              found=exc.found) from None
    return version


def run_target(python: Path, target: Path, config: Path, prompts, *, vocab_size: int,
               max_new_tokens: int, timeout: float = TIMEOUT_SECONDS) -> TargetRun | Refused:
    """The target alone through the host ``config`` (a drafter's config.json) picks, greedy,
    exactly max_new_tokens tokens a prompt."""
    request = {"mode": "target", "target": str(target), "config": str(config),
               "prompts": [list(map(int, p)) for p in prompts], "max_new_tokens": max_new_tokens}
    parsed, seconds = _run(
        python, request, "the target alone",
        lambda rec, wall: read_target(rec, prompts, vocab_size=vocab_size,
                                      max_new_tokens=max_new_tokens, wall=wall),
        limit=records_limit(prompts, max_new_tokens=max_new_tokens, block_size=0),
        timeout=timeout)
    if isinstance(parsed, Refused):
        return parsed
    version, host, outputs = parsed
    return TargetRun(version=version, host=host, outputs=tuple(outputs), seconds=seconds)


def run_drafter(python: Path, checkpoint: Path, target: Path, prompts, *, vocab_size: int,
                block_size: int, max_new_tokens: int, what: str,
                timeout: float = TIMEOUT_SECONDS) -> DrafterRun | Refused:
    """dspark-mlx's speculative loop with the drafter of ``checkpoint`` (DeepSpec's layout)
    on ``target``, every draft recorded."""
    request = {"mode": "drafter", "checkpoint": str(checkpoint), "target": str(target),
               "prompts": [list(map(int, p)) for p in prompts], "max_new_tokens": max_new_tokens}
    parsed, seconds = _run(
        python, request, what,
        lambda rec, wall: read_drafter(rec, prompts, vocab_size=vocab_size,
                                       block_size=block_size, max_new_tokens=max_new_tokens,
                                       wall=wall),
        limit=records_limit(prompts, max_new_tokens=max_new_tokens, block_size=block_size),
        timeout=timeout)
    if isinstance(parsed, Refused):
        return parsed
    version, loaded, runs = parsed
    return DrafterRun(version=version, loaded=loaded, prompts=tuple(runs), seconds=seconds)


def parse_records(data: bytes, mode: str, prompts, *, vocab_size: int, block_size: int = 0,
                  max_new_tokens: int):
    """Records given whole (the tests' hostile records): what ``run_target`` /
    ``run_drafter`` read from the pipe, by the same reader."""
    import io

    rec = _Records(io.BytesIO(data).read, run="records given whole",
                   limit=records_limit(prompts, max_new_tokens=max_new_tokens,
                                       block_size=block_size))
    if mode == "probe":
        return read_probe(rec)
    if mode == "target":
        return read_target(rec, prompts, vocab_size=vocab_size, max_new_tokens=max_new_tokens)
    return read_drafter(rec, prompts, vocab_size=vocab_size, block_size=block_size,
                        max_new_tokens=max_new_tokens)

