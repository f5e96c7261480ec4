"""llama.cpp for the tests: the one way a test finds the engine, runs its converter and its
binaries. The build is tools/llama_cpp.py's (`make llama-cpp`; `make test` builds
it when missing).

Where the build is missing a test skips, except under CI (``CI=true``), where it FAILS: the
engine tests are part of what CI proves, and a skip there would hide a broken build step.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.tools import load_tool

from dspark_convert.evaluation import log_drain
from dspark_convert.evaluation.engine_llama_cpp import SPEC_TYPES, rerun_while_cut

# tools/llama_cpp.py imports tools/engine_cache.py, beside it, by its plain name.
build = load_tool("tools/llama_cpp.py", siblings=("engine_cache",))

# What every speculative run of the tests uses (docs/REFERENCE.md §6b).
SPEC_ARGS = ("--spec-draft-n-max", "7", "--spec-draft-p-min", "0", "--temp", "0", "-lv", "4")
SECONDS = 120
# llama.cpp 0c1e570 loses the last lines of a run's log, the statistics line or the generated
# text among them, unless its logger is let finish (it is never flushed at exit:
# common/log.cpp). These runs get the eval's log drain (evaluation/log_drain.py) and its
# rerun (engine_llama_cpp.rerun_while_cut) for what the drain misses. The queue is first in,
# first out, so a run whose last line (perf_print's "graphs reused", after the text and the
# statistics) arrived is whole; one that is cut is run again, up to RETRIES times, never judged.
LAST_LINE = {"llama-speculative-simple": re.compile(r"target:\n(?:.*\n)*.*graphs reused"),
             "llama-completion": re.compile(r"graphs reused")}
RETRIES = 5

# llama.cpp's converter, as a new user of a tiny test tokenizer must run it: the tokenizer's
# pre-tokenizer hash is not one convert_hf_to_gguf.py knows, so `get_vocab_base_pre` (which
# only names the pre-tokenizer: the vocabulary and merges still come from tokenizer.json)
# is made to answer "qwen2", the pre-tokenizer of the Qwen tokenizer the golden one mimics.
# Nothing else of the converter is touched; it runs from the cached sdist with its own
# gguf-py first on the path, as its own script arranges.
_CONVERT = r"""
import runpy, sys
from pathlib import Path
src = Path(sys.argv.pop(1))
sys.path.insert(0, str(src))
sys.path.insert(1, str(src / "gguf-py"))
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv[0] = str(src / "convert_hf_to_gguf.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass(frozen=True)
class Run:
    returncode: int
    out: bytes              # what the program printed on stdout, surrounding blank lines cut
    stderr: str

    @property
    def text(self) -> str:
        return self.out.decode("utf-8", "replace")

    @property
    def stats(self) -> str | None:
        """llama-speculative-simple's statistics line without its timestamp and timings:
        calls, drafts, tokens, mean acceptance length, acceptance rate by position."""
        match = re.search(r"statistics\s+(\S+: .*?), dur\(b,g,a\)", self.stderr)
        return match.group(1) if match else None

    @property
    def mean_acceptance(self) -> float | None:
        match = re.search(r"#mean acc len = (\d{1,10}\.\d\d)\b", self.stderr)
        return float(match.group(1)) if match else None


@dataclass(frozen=True)
class LlamaCpp:
    bin: Path
    source: Path                 # the unpacked vendor/llama.cpp

    def convert(self, model: Path, out: Path, *, target_dir: Path | None = None) -> Path:
        """llama.cpp's own convert_hf_to_gguf.py, BF16, as llama.cpp's users run it."""
        cmd = [sys.executable, "-c", _CONVERT, str(self.source), str(model), "--outtype",
               "bf16", "--outfile", str(out)]
        if target_dir is not None:
            cmd += ["--target-model-dir", str(target_dir)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        assert done.returncode == 0, f"convert_hf_to_gguf.py {model} failed:\n{done.stderr[-3000:]}"
        return out

    def _run(self, name: str, *args: str) -> Run:
        def once() -> Run:
            done = subprocess.run([str(self.bin / name), *args], capture_output=True,
                                  timeout=SECONDS, stdin=subprocess.DEVNULL,
                                  env=log_drain.environment())
            return Run(done.returncode, done.stdout.strip(b"\n"),
                       done.stderr.decode("utf-8", "replace"))

        def cut(run: Run) -> AssertionError:
            return AssertionError(f"{name}: its log was cut {RETRIES} times in a row (the last "
                                  f"line never came):\n{run.stderr[-1500:]}")

        # A failed run is returned as it is (a test may expect the refusal), never retried.
        return rerun_while_cut(
            once, lambda run: run.returncode != 0 or LAST_LINE[name].search(run.stderr) is not None,
            attempts=RETRIES, cut=cut)

    def speculative(self, target: Path, draft: Path, kind: str, prompt: str, n: int) -> Run:
        """llama-speculative-simple: ``kind`` "dspark" or "dflash"."""
        return self._run("llama-speculative-simple", "-m", str(target), "-md", str(draft),
                         "--spec-type", SPEC_TYPES[kind], *SPEC_ARGS, "-p", prompt,
                         "-n", str(n), "-t", "1")

    def completion(self, target: Path, prompt: str, n: int) -> Run:
        """llama-completion on the target alone, greedy; its closing " [end of text]"
        marker (printed when generation stops) is not part of the text."""
        run = self._run("llama-completion", "-m", str(target), "-p", prompt, "-n", str(n),
                        "--temp", "0", "-no-cnv", "-t", "1")
        return Run(run.returncode, run.out.removesuffix(b" [end of text]"), run.stderr)

    def lossless(self, target: Path, run: Run, prompt: str, n: int) -> bool:
        """Whether a speculative run printed exactly the target's own greedy text. It may
        print a few tokens past -n (its last verify step accepts a whole draft), so its text
        must be the start of the target's for n + a block, and no shorter than for n."""
        longer = self.completion(target, prompt, n + 8)
        exact = self.completion(target, prompt, n)
        assert longer.returncode == exact.returncode == 0, longer.stderr[-2000:]
        return longer.out.startswith(run.out) and len(run.out) >= len(exact.out)


def engine() -> LlamaCpp:
    """The cached build, or a skip (a failure under CI=true) naming how to build it."""
    problem = build.build_problem()
    if problem is not None:
        message = (f"llama.cpp {build.COMMIT} is not built in {build.build_dir()} ({problem}): "
                   "run `make llama-cpp` (make test builds it)")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return LlamaCpp(build.bin_dir(), build.source_dir())


@dataclass(frozen=True)
class Golden:
    """The golden target and both DeepSpec-trained drafters, in llama.cpp's files and ours."""
    engine: LlamaCpp
    target: Path                          # llama.cpp's converter on golden/reference/target
    converter: dict[str, Path]            # its converter's drafter file, by drafter name
    artifacts: dict[str, Path]            # our artifacts (converted with --target)
    exports: dict[str, Path]              # `dspark export` (the default layout)
    kept: dict[str, Path]                 # `dspark export --keep-embedding`


# Which --spec-type each golden drafter runs with.
KINDS = {"vanilla_conf_markov": "dspark", "dflash_shared": "dflash"}


def make_golden(root: Path, artifacts: dict[str, Path]) -> Golden:
    from support.paths import GOLDEN_TARGET, TRAINED_DRAFTERS

    from dspark_convert.commands.export import export_llama_cpp

    llama = engine()
    target = llama.convert(GOLDEN_TARGET, root / "target.gguf")
    converter, exports, kept = {}, {}, {}
    for name, src in TRAINED_DRAFTERS.items():
        converter[name] = llama.convert(src, root / f"{name}.converter.gguf",
                                        target_dir=GOLDEN_TARGET)
        exports[name] = export_llama_cpp(artifacts[name], target,
                                         root / f"{name}.export.gguf").output
        kept[name] = export_llama_cpp(artifacts[name], target, root / f"{name}.kept.gguf",
                                      keep_embedding=True).output
    return Golden(llama, target, converter, dict(artifacts), exports, kept)


# --- a target GGUF without llama.cpp, for the export's own tests -------------------------------

def _safetensors_bytes(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    import json
    import struct

    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    return {name: (v["dtype"], v["shape"], raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for name, v in header.items() if name != "__metadata__"}


def write_target_gguf(path: Path, *, arch: str = "qwen3", hidden: int | None = None,
                      layers: int | None = None, vocab: int | None = None,
                      embed_type: str = "BF16", change_embedding: bool = False,
                      change_head: bool = False, tied: bool = False,
                      drop: tuple[str, ...] = ()) -> Path:
    """The golden target as a GGUF holding what `export` reads, written with gguf-py: the
    architecture, its hidden size, layer count and context length, the tokenizer keys (the
    tokens of golden/reference/target/tokenizer.json, padded as llama.cpp's converter pads
    them) and the real embedding and head bytes (BF16; ``embed_type`` "Q8_0" quantizes the
    embedding with gguf-py). The keyword arguments make it wrong in one way each. The
    llama.cpp tests use llama.cpp's own converter instead (Golden.target)."""
    import json

    import numpy as np
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
    from gguf import quants as gquants

    from support.paths import GOLDEN_TARGET

    config = json.loads((GOLDEN_TARGET / "config.json").read_text())
    tensors = _safetensors_bytes(GOLDEN_TARGET / "model.safetensors")
    tokenizer = json.loads((GOLDEN_TARGET / "tokenizer.json").read_text())
    H, V = config["hidden_size"], vocab or config["vocab_size"]
    by_id = {i: t for t, i in tokenizer["model"]["vocab"].items()}
    by_id.update({a["id"]: a["content"] for a in tokenizer.get("added_tokens", [])})
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(V)]

    writer = GGUFWriter(path, arch)
    values = [
        (f"{arch}.block_count", layers or config["num_hidden_layers"], GGUFValueType.UINT32),
        (f"{arch}.context_length", config["max_position_embeddings"], GGUFValueType.UINT32),
        (f"{arch}.embedding_length", hidden or H, GGUFValueType.UINT32),
        ("tokenizer.ggml.model", "gpt2", GGUFValueType.STRING),
        ("tokenizer.ggml.pre", "qwen2", GGUFValueType.STRING),
    ]
    for key, value, gtype in values:
        if key not in drop:
            writer.add_key_value(key, value, gtype)
    if "tokenizer.ggml.tokens" not in drop:
        writer.add_key_value("tokenizer.ggml.tokens", tokens, GGUFValueType.ARRAY,
                             sub_type=GGUFValueType.STRING)
    writer.add_key_value("tokenizer.ggml.token_type", [1] * V, GGUFValueType.ARRAY,
                         sub_type=GGUFValueType.INT32)
    merges = [" ".join(m) if isinstance(m, list) else m for m in tokenizer["model"]["merges"]]
    writer.add_key_value("tokenizer.ggml.merges", merges, GGUFValueType.ARRAY,
                         sub_type=GGUFValueType.STRING)
    writer.add_key_value("tokenizer.ggml.bos_token_id", 1, GGUFValueType.UINT32)

    def bf16(name: str, flip: bool) -> np.ndarray:
        data = bytearray(tensors[name][2])
        if flip:
            data[0] ^= 1
        return np.frombuffer(bytes(data), dtype=np.uint16).reshape(V, H)

    emb = bf16("model.embed_tokens.weight", change_embedding)
    if embed_type == "BF16":
        writer.add_tensor("token_embd.weight", emb, raw_dtype=GGMLQuantizationType.BF16)
    else:
        wide = (emb.astype(np.uint32) << 16).view(np.float32)
        qtype = GGMLQuantizationType[embed_type]
        writer.add_tensor("token_embd.weight", gquants.quantize(wide, qtype), raw_dtype=qtype)
    if not tied:
        writer.add_tensor("output.weight", bf16("lm_head.weight", change_head),
                          raw_dtype=GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --- one edit of a GGUF file (the loader corpus) ----------------------------------------------

def rewrite_gguf(src: Path, dst: Path, *, drop_keys: tuple[str, ...] = (),
                 set_keys: dict | None = None, drop_tensors: tuple[str, ...] = (),
                 add_tensors: dict | None = None) -> Path:
    """``src`` written again with gguf-py, with one kind of edit: keys dropped, keys set
    (``{key: (value, GGUFValueType, sub_type or None)}``; a new key is appended), tensors
    dropped, tensors added or replaced (``{name: (GGUF shape, type name)}``, zeros; a
    replaced one keeps its place). Everything else is copied byte for byte, in order."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.constants import GGML_QUANT_SIZES

    set_keys, add_tensors = dict(set_keys or {}), dict(add_tensors or {})
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    arch = set_keys.get("general.architecture", (arch,))[0]
    writer = GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        if key in set_keys:
            value, gtype, sub = set_keys.pop(key)
        else:
            gtype = field.types[0]
            sub = field.types[1] if gtype == GGUFValueType.ARRAY else None
            value = field.contents()
        writer.add_key_value(key, value, gtype, sub_type=sub)
    for key, (value, gtype, sub) in set_keys.items():
        if key != "general.architecture":
            writer.add_key_value(key, value, gtype, sub_type=sub)

    def zeros(shape, type_name):
        qtype = GGMLQuantizationType[type_name]
        block, size = GGML_QUANT_SIZES[qtype]
        row = shape[0] // block * size
        return np.zeros((*reversed(shape[1:]), row), dtype=np.uint8), qtype

    for t in reader.tensors:
        if t.name in drop_tensors:
            continue
        if t.name in add_tensors:
            data, qtype = zeros(*add_tensors.pop(t.name))
        else:
            ne = [int(d) for d in t.shape]
            raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
            data = raw.reshape(*reversed(ne[1:]), raw.size // max(1, int(np.prod(ne[1:]))))
            qtype = t.tensor_type
        writer.add_tensor(t.name, data, raw_dtype=qtype)
    for name, spec in add_tensors.items():
        data, qtype = zeros(*spec)
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
