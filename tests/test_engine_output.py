"""An engine's output is hostile input: llama.cpp's log and stdout,
read by evaluation/engine_llama_cpp.py as strictly as a user's file.

The logs here are the real binaries' (llama.cpp 0c1e570 on the golden target and drafter,
support/llama_cpp: a missing build skips, and FAILS under CI=true), then edited one way each
and fed to the parser, a pure function of the bytes it reads: a hostile log is its input,
not a mock. The runner's own paths (a crash, output that is no log, a log cut or endless)
are driven by real processes on real pipes: small programs of ours standing where the
binaries stand, since llama.cpp will not crash, go silent or write 800 MiB on demand."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.cli import assert_refused, run_cli
from support.fuzz import fuzz_settings, patched_limits
from support.llama_cpp import engine, write_target_gguf
from support.paths import GOLDEN_TARGET

from dspark_convert.errors import EngineOutputError, EngineRunError, TargetGGUFMismatchError
from dspark_convert.evaluation import engine_llama_cpp as L
from dspark_convert.evaluation import engine_log
from dspark_convert.evaluation import log_drain

DSPARK = "vanilla_conf_markov"
HELLO = "hello world"
N = 8
# A prompt that quotes llama.cpp's own lines, as llama-completion --verbose-prompt echoes it
# into its log: read as a log, the target alone made 1000 tokens at 99,900,000 tok/s.
ECHO = ("hello\n0.00.211.417 I decoded 1000 tokens in 0.00001 seconds, speed: 99900000 t/s\n"
        "0.00.211.418 I common_perf_print:        eval time =       0.01 ms /  1000 runs   "
        "(    0.00 ms per token, 99900000.00 tokens per second)\n"
        "0.00.211.419 I common_perf_print:    graphs reused =          1\nworld")


@pytest.fixture(scope="module")
def golden(llama_golden):
    return llama_golden


@pytest.fixture(scope="module")
def vocab(golden):
    return L.read_vocabulary(golden.target)


@pytest.fixture(scope="module")
def bins(golden):
    return L.find_binaries(golden.engine.bin)


@pytest.fixture(scope="module")
def hello_ids():
    from dspark_convert.target.tokenizer import fingerprint_tokenizer

    return tuple(fingerprint_tokenizer(GOLDEN_TARGET / "tokenizer.json").encode(HELLO))


def _real_log(binary: Path, args: list[str]) -> bytes:
    """A whole log as the binary writes it with the eval's own arguments."""
    def once() -> subprocess.CompletedProcess:
        return subprocess.run([str(binary), *args], capture_output=True, timeout=120, check=True,
                              env=log_drain.environment(), stdin=subprocess.DEVNULL)

    return L.rerun_while_cut(
        once, lambda done: b"graphs reused" in done.stderr, attempts=L.ATTEMPTS,
        cut=lambda _done: pytest.fail.Exception("llama.cpp lost the end of its log in every run")
    ).stderr


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    return lambda text: _write(tmp_path_factory.mktemp("prompt") / "p.txt", text.encode() + b"\n")


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def spec_log(golden, bins, prompt_file) -> bytes:
    return _real_log(bins.speculative, L.speculative_args(
        golden.target, golden.exports[DSPARK], prompt_file(HELLO), spec_type="draft-dspark",
        n_max=7, max_new_tokens=N))


@pytest.fixture(scope="module")
def comp_log(golden, bins, prompt_file) -> bytes:
    return _real_log(bins.completion, L.completion_args(golden.target, prompt_file(HELLO),
                                                        max_new_tokens=N))


def _spec(log: bytes, vocab, hello_ids, **kw) -> L.SpeculativeLog:
    return L.parse_speculative(log, kw.pop("ids", hello_ids), spec_type=kw.pop("spec_type", "draft-dspark"),
                               vocab=vocab, n_max=7, max_new_tokens=N)


def _comp(log: bytes, vocab, prompt: str = HELLO) -> L.CompletionLog:
    return L.parse_completion(log, prompt=prompt, vocab=vocab, max_new_tokens=N)


def _edit(log: bytes, pattern: bytes, repl: bytes, count: int = 1) -> bytes:
    out, n = re.subn(pattern, repl, log, count=count)
    assert n, f"the real log holds no {pattern!r}"
    return out


# --- what llama.cpp writes, read --------------------------------------------------------------

@pytest.mark.slow
def test_the_real_logs_parse(spec_log, comp_log, vocab, hello_ids):
    comp = _comp(comp_log, vocab)
    assert comp.prompt_ids == hello_ids and 0 < comp.decode_tokens <= N
    assert re.fullmatch(r"system_info: n_threads = 1 \(n_threads_batch = 1\) / \d+ \| CPU : .*",
                        comp.system_info)
    spec = _spec(spec_log, vocab, hello_ids)
    stated = spec.stats.mean_acceptance_length
    verified = spec.drafts[next(i for i, d in enumerate(spec.drafts) if d.tokens):]
    assert stated == pytest.approx(1 + sum(d.accepted for d in verified) / len(verified), abs=0.006)
    assert spec.decode_tokens == len(spec.output_ids) <= N + 7 + L.TOKEN_SLACK


@pytest.mark.slow
def test_a_prompt_quoting_a_log_line_is_read_as_the_prompt(golden, bins, vocab):
    """The echoed prompt is consumed by its length: the lines it quotes are its text, and
    the run reports llama.cpp's own figures (at most N tokens, not 1000)."""
    run = L.run_target(bins, golden.target, ECHO, vocab=vocab, max_new_tokens=N)
    assert vocab.text(run.prompt_ids, special=True) == ECHO.encode()
    assert run.decode_tokens <= N and run.decode_seconds < run.seconds
    spec = L.run_speculative(bins, golden.target, golden.exports[DSPARK], kind="dspark",
                             prompt_text=ECHO, prompt_ids=run.prompt_ids, vocab=vocab,
                             max_new_tokens=N, n_max=7)
    assert spec.decode_tokens <= N + 7 and spec.drafts[0].context == run.prompt_ids[:-1]


@pytest.mark.slow
def test_eval_reports_the_real_figures_of_a_prompt_quoting_a_log_line(golden, bins, vocab,
                                                                      paired_artifacts, tmp_path):
    """The prompt is given as llama.cpp's own token ids of ECHO (the golden tokenizer merges
    digits that llama.cpp's qwen2 pre-tokenizer splits: as text it would be skipped, its ids
    not llama.cpp's); eval passes llama.cpp their text, ECHO, and reports the real figures."""
    ids = L.run_target(bins, golden.target, ECHO, vocab=vocab, max_new_tokens=N).prompt_ids
    assert vocab.text(ids, special=True) == ECHO.encode()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "echo", "prompt_ids": list(ids)}) + "\n")
    out = tmp_path / "report"
    proc = run_cli("eval", str(paired_artifacts[DSPARK]), "--target", str(GOLDEN_TARGET),
                   "--prompts", str(prompts), "--max-new-tokens", str(N), "--engine",
                   f"llama.cpp={golden.engine.bin}", "--target-gguf", str(golden.target),
                   "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    target, drafter = report["engine_runs"]
    assert [p["id"] for p in target["prompts"]] == ["echo"] and not target["prompts_skipped"]
    assert 0 < target["new_tokens"] <= N and target["tokens_per_second"] < 1e7
    assert drafter["proposals"]["compared"] > 0 and drafter["lossless"] is True


# --- the log's own lines, edited one way each -------------------------------------------------

SPEC_EDITS = {
    # A GGUF's name printed while the models load, holding a line of the log's end.
    "a decoded line among the loading lines": (
        rb"(llama_model_loader: loaded meta data[^\n]*\n)",
        rb"\g<1>0.00.000.001 I decoded    3 tokens in    0.001 seconds, speed: 3000.000 t/s\n",
        "a decoded line where none belongs"),
    "a second decoded line": (rb"(\n[^\n]*I decoded [^\n]*\n)", rb"\1\1",
                              "a second decoded line"),
    "a verification before the loop began": (
        rb"(llama_model_loader: loaded meta data[^\n]*\n)",
        rb"\g<1>0.00.000.001 D accepted 7/7 draft tokens, the last target token is: (1)\n",
        "a verification line where none belongs"),
    "a 5000-digit count": (rb"decoded +\d+ tokens", b"decoded " + b"9" * 5000 + b" tokens",
                           "a malformed decoded line"),
    "a rate x": (rb"(decoded[^\n]*speed: +)[0-9.]+", rb"\1x", "a malformed decoded line"),
    "a target token of -7": (rb"(the last target token is: )\(\d+\)", rb"\1(-7)",
                             "the target's token -7 is outside the vocabulary"),
    "a target token of 99999": (rb"(the last target token is: )\(\d+\)", rb"\1(99999)",
                                "the target's token 99999 is outside the vocabulary"),
    "a candidate's piece that is not its token's": (
        rb"(draft candidate   0, pos   0: +\d+ \( *[0-9.]+\) ')[^'\n]*'", rb"\1XYZ'",
        "piece differs from what the eval knows"),
    "an acceptance rate of 7": (rb"(#acc rate/pos = \()[0-9.]+", rb"\g<1>7.000",
                                "its acceptance rates by position"),
    "a mean acceptance length of 99": (rb"#mean acc len = [0-9.]+", b"#mean acc len = 99.00",
                                       "its mean acceptance length 99.0"),
    "more accepted tokens than its cycles": (rb"#acc tokens = +\d+", b"#acc tokens = 999",
                                             "its #acc tokens is 999"),
    "another spec type added": (rb"adding speculative implementation 'draft-dspark'",
                                b"adding speculative implementation 'draft-dflash'",
                                "implementation draft-dflash"),
    "a decoded count that is not its cycles'": (rb"decoded +\d+ tokens", b"decoded    3 tokens",
                                                "its decoded count is 3"),
    "a partial acceptance": (rb"(\n[^\n]*D accepted [^\n]*\n)",
                             rb"\g<1>" + b"0.00.100.000 D partial acceptance: 1 < 7, restoring checkpoint\n",
                             "partial acceptance"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", SPEC_EDITS, ids=list(SPEC_EDITS))
def test_an_edited_speculative_log_is_refused(case, spec_log, vocab, hello_ids):
    pattern, repl, needle = SPEC_EDITS[case]
    with pytest.raises(EngineOutputError, match=re.escape(needle)) as exc:
        _spec(_edit(spec_log, pattern, repl), vocab, hello_ids)
    assert exc.value.message.startswith(f"{L.SPECULATIVE}: ") and "expected" in exc.value.message


COMP_EDITS = {
    "a time 0..88 ms": (rb"(eval time = +)[0-9.]+ ms / +(\d+) runs", rb"\g<1>0..88 ms / \2 runs",
                        "a malformed eval time line"),
    "a rate x": (rb"(\n[^\n]*common_perf_print: +eval time[^\n]*ms per token, +)[0-9.]+",
                 rb"\1x", "a malformed eval time line"),
    "1000 eval runs at -n 8": (rb"(eval time = +[0-9.]+ ms / +)\d+ runs", rb"\g<1>1000 runs",
                               "the eval runs 1000 is over 8"),
    "a 5000-digit prompt token count": (rb"number of tokens in prompt = \d+",
                                        b"number of tokens in prompt = " + b"7" * 5000,
                                        "a malformed prompt token count line"),
    "a prompt token of 99999": (rb"(\n[^\n]* I ) +260 -> 'he'", rb"\1 99999 -> 'he'",
                                "a prompt token 99999 is outside the vocabulary"),
    "a prompt echoed that is not the prompt": (rb"prompt: 'hello world'", b"prompt: 'hello wOrld'",
                                               "the prompt echoed differs"),
    "a second eval time line": (rb"(\n[^\n]*common_perf_print: +eval time[^\n]*\n)",
                                rb"\1\1", "a second eval time line"),
    "an eval time line before the prompt": (
        rb"(\n[^\n]*system_info: [^\n]*\n)",
        rb"\g<1>" + b"0.00.000.002 I common_perf_print:        eval time =       0.01 ms /     1 runs"
        b"   (    0.00 ms per token,  1000.00 tokens per second)\n",
        "an eval time line where none belongs"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", COMP_EDITS, ids=list(COMP_EDITS))
def test_an_edited_completion_log_is_refused(case, comp_log, vocab):
    pattern, repl, needle = COMP_EDITS[case]
    with pytest.raises(EngineOutputError, match=re.escape(needle)):
        _comp(_edit(comp_log, pattern, repl), vocab)


@pytest.mark.slow
def test_a_log_that_ends_early_says_where(spec_log, vocab, hello_ids):
    cut = spec_log[: spec_log.rindex(b"\n", 0, spec_log.index(b"statistics")) + 1]
    with pytest.raises(EngineOutputError, match=r"its log ends after .*draft:.* before "
                                                r"llama.cpp's closing line"):
        _spec(cut, vocab, hello_ids)


@pytest.mark.parametrize("output", [b"", b"Segmentation fault\x00\xff garbage\n" * 3])
def test_output_that_is_no_log_says_what_was_seen(output):
    vocab = L.Vocabulary((b"a",), (b"a",))
    needle = f"no line of llama.cpp's log in {len(output)} bytes of output"
    with pytest.raises(EngineOutputError, match=re.escape(needle)):
        L.parse_speculative(output, (0, 0), spec_type="draft-dspark", vocab=vocab, n_max=7,
                            max_new_tokens=N)


@pytest.mark.slow
def test_a_draft_whose_tokens_are_missing_is_refused(spec_log, vocab, hello_ids):
    broken = _edit(spec_log, rb"\n[^\n]* D  - seq_id 0, draft candidate   0, pos   3:[^\n]*", b"")
    with pytest.raises(EngineOutputError, match="draft 1 holds 7 tokens"):
        _spec(broken, vocab, hello_ids)


@pytest.mark.slow
def test_a_context_length_that_is_not_the_one_rebuilt_is_refused(spec_log, vocab, hello_ids):
    with pytest.raises(EngineOutputError, match="draft 1 was made from 6 committed tokens"):
        _spec(spec_log, vocab, hello_ids, ids=(1,) + hello_ids)


@pytest.mark.slow
def test_a_run_that_drafted_nothing_compares_nothing_and_says_so(spec_log, vocab, hello_ids):
    """llama.cpp's loop with no draft made (every cycle 'accepted 0/0'): read as such, its
    proposal check compares nothing, and report.md says so instead of a clean 0 / 0."""
    from dspark_convert.evaluation.proposals import check_proposals
    from dspark_convert.evaluation.report import EngineInfo, EngineRun, _engine_section

    log = re.sub(rb"\n[^\n]*(?: - seq_id |called impl |truncating draft)[^\n]*", b"", spec_log)
    log = re.sub(rb"accepted \d+/\d+ draft", b"accepted 0/0 draft", log)
    log = re.sub(rb"#calls\(b,g,a\) = +(\d+) +(\d+) +\d+, #gen drafts = +\d+, #acc drafts = +\d+, "
                 rb"#gen tokens = +\d+, #acc tokens = +\d+, #mean acc len[^)]*\)",
                 rb"#calls(b,g,a) = \1 \2 0, #gen drafts = 0, #acc drafts = 0, #gen tokens = 0, "
                 rb"#acc tokens = 0", log)
    cycles = len(re.findall(rb"accepted 0/0", log))
    log = re.sub(rb"decoded +\d+ tokens", b"decoded %d tokens" % cycles, log)
    log = re.sub(rb"n_predict = \d+", b"n_predict = %d" % cycles, log)
    log = re.sub(rb"n_drafted = \d+", b"n_drafted = 0", log)
    log = re.sub(rb"n_accept  = \d+", b"n_accept  = 0", log)
    spec = _spec(log, vocab, hello_ids)
    assert spec.drafts and not any(d.tokens for d in spec.drafts)
    check = check_proposals([], proposer=None)
    assert check.compared == 0
    run = EngineRun(engine="llama.cpp", kind="drafter", artifact="a", spec_type="draft-dspark",
                    drafter_file_sha256="0" * 64, temperature=0.0, prompts=[], prompts_skipped=[],
                    new_tokens=0, seconds=0.0, tokens_per_second=None, tau=None,
                    acceptance_by_position=None, lossless=True, proposals=check)
    info = EngineInfo(engine="llama.cpp", binaries="b", target_gguf="t", target_gguf_sha256="0" * 64)

    class _Report:           # what _engine_section reads of an EvalReport
        engine, engines, engine_runs = info, [info], [run]

    assert "**none: llama.cpp drafted nothing**" in "\n".join(_engine_section(_Report))


# --- bounds: a line, the whole log -------------------------------------------------------------

@pytest.mark.slow
def test_a_line_longer_than_the_bound_is_refused(comp_log, vocab):
    long = _edit(comp_log, rb"(\n[^\n]*sampler seed: )", rb"\g<1>" + b"9" * 5000)
    with patched_limits(engine_log, {"LINE_LIMIT": 4096}):
        with pytest.raises(EngineOutputError, match="is longer than 4,096 bytes"):
            _comp(long, vocab)


@pytest.mark.slow
def test_a_log_over_its_bound_is_refused(comp_log, vocab):
    with pytest.raises(EngineOutputError, match="its log exceeds 1,000 bytes"):
        L.read_completion_log(__import__("io").BytesIO(comp_log).read, prompt=HELLO, vocab=vocab,
                              max_new_tokens=N, limit=1000)


# A program standing where llama.cpp's binaries stand: it writes MODE's output and ends so.
FAKE = r"""#!{python}
import os, signal, sys
mode = {mode!r}
with open({count!r}, "a") as fh:
    fh.write("run\n")
err = sys.stderr.buffer
if mode == "crash":
    err.write(b"0.00.000.100 I llama_completion: llama backend init\n"
              b"0.00.000.200 I load_tensors:   AMX model buffer size =     0.20 MiB\n"
              b"0.00.000.300 I system_info: n_threads = 1 (n_threads_batch = 1) / 2 | CPU : AMX_INT8 = 1 |\n")
    err.flush()
    os.kill(os.getpid(), signal.SIGSEGV)
elif mode == "garbage":
    err.write(b"not a log\n")
elif mode == "cut":
    err.write(b"0.00.000.100 I llama_completion: llama backend init\n")
elif mode == "flood":
    line = b"0.00.000.100 D " + b"x" * 65000 + b"\n"
    for _ in range({lines}):
        err.write(line)
"""


def _fake_binaries(tmp_path: Path, mode: str, lines: int = 0) -> tuple[L.Binaries, Path]:
    count = tmp_path / "runs.txt"
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for name in L.BINARIES:
        p = d / name
        p.write_text(FAKE.format(python=sys.executable, mode=mode, count=str(count), lines=lines))
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return L.find_binaries(d), count


def test_a_crash_names_the_signal_the_run_the_command_its_last_lines_and_the_amx_cause(tmp_path):
    bins, count = _fake_binaries(tmp_path, "crash")
    vocab = L.Vocabulary((b"a",), (b"a",))
    with pytest.raises(EngineRunError) as exc:
        L.run_target(bins, tmp_path / "t.gguf", HELLO, vocab=vocab, max_new_tokens=N,
                     what="the target alone, prompt p1")
    m = exc.value.message
    assert "\n" not in m and exc.value.found == "SIGSEGV"
    for needle in ("llama-completion (the target alone, prompt p1) failed, killed by SIGSEGV",
                   "weights repacked for AMX", "--no-repack (-nr)", "command: ",
                   "--verbose-prompt", "AMX model buffer size", " | "):
        assert needle in m, m
    assert count.read_text() == "run\n"           # a crash is never rerun


@pytest.mark.parametrize("mode, runs, needle", [
    ("garbage", 1, "no line of llama.cpp's log in 10 bytes of output"),
    ("cut", L.ATTEMPTS, "its log ends after 0.00.000.100 I llama_completion: llama backend init"),
])
def test_only_a_log_that_looks_cut_is_run_again(tmp_path, mode, runs, needle):
    bins, count = _fake_binaries(tmp_path, mode)
    vocab = L.Vocabulary((b"a",), (b"a",))
    with pytest.raises(EngineOutputError, match=re.escape(needle)):
        L.run_target(bins, tmp_path / "t.gguf", HELLO, vocab=vocab, max_new_tokens=N)
    assert count.read_text() == "run\n" * runs


BOUNDED = r"""
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from dspark_convert.errors import EngineOutputError
from dspark_convert.evaluation import engine_llama_cpp as L
bins = L.find_binaries({bin!r})
vocab = L.Vocabulary((b"a",), (b"a",))
try:
    L.run_target(bins, Path("t.gguf"), "hello", vocab=vocab, max_new_tokens=8)
except EngineOutputError as exc:
    print(exc.exit_code, exc.message)
"""


def _bounded_python(code: str, memory_mb: int, seconds: float) -> subprocess.CompletedProcess:
    limit = memory_mb << 20

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, "-c", code], preexec_fn=cap, capture_output=True,
                          text=True, timeout=seconds)


@pytest.mark.slow
def test_800_mib_of_log_is_refused_in_bounded_memory(tmp_path):
    """An engine that writes 800 MiB of log (1.9 GB peak RSS when it was held whole): the
    run is refused (113) at its bound, read under a 400 MiB address-space cap."""
    bins, _ = _fake_binaries(tmp_path, "flood", lines=800 * 1024 * 1024 // 65016)
    proc = _bounded_python(BOUNDED.format(tests=str(Path(__file__).parent), bin=str(bins.directory)),
                           memory_mb=400, seconds=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("113 llama-completion: its log exceeds"), proc.stdout


READ_ALL = r"""
import subprocess, sys
from dspark_convert.evaluation import engine_llama_cpp as L
writer = subprocess.Popen([sys.executable, "-c", {writer!r}], stdout=subprocess.PIPE)
vocab = L.Vocabulary((b"a",), (b"a",))
cut = L.read_completion_log(writer.stdout.read1, prompt="hello", vocab=vocab, max_new_tokens=8,
                            limit=1 << 40)
writer.wait()
print(type(cut).__name__, cut.total, cut.entries)
"""
WRITER = ("import sys\nline = b'0.00.000.100 D ' + b'y' * 65000 + b'\\n'\n"
          "for _ in range(12900): sys.stdout.buffer.write(line)\n")


@pytest.mark.slow
def test_the_reader_holds_one_line_not_the_log(tmp_path):
    """The parser reads 800 MiB from a real pipe, to its end, under a 300 MiB cap: it keeps
    a line and the last lines for messages, never the log."""
    proc = _bounded_python(READ_ALL.format(writer=WRITER), memory_mb=300, seconds=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kind, total, entries = proc.stdout.split()
    assert (kind, int(total), int(entries)) == ("Cut", 12900 * 65016, 12900)


# --- any bytes at all ------------------------------------------------------------------------

_LINES = st.sampled_from([
    b"0.00.000.001 I system_info: n_threads = 1 (n_threads_batch = 1) / 2 | CPU : X = 1 |",
    b"0.00.000.002 I llama_completion: prompt: 'ab'", b"0.00.000.002 I main: prompt: 'a\nb'",
    b"0.00.000.003 I llama_completion: number of tokens in prompt = 2",
    b"0.00.000.004 I      0 -> 'a'", b"0.00.000.004 I     -1 -> 'a'", b"0.00.000.004 I      1 -> 'b'",
    b"0.00.000.005 I common_perf_print:        eval time =       0.10 ms /     2 runs   "
    b"(    0.05 ms per token, 20000.00 tokens per second)",
    b"0.00.000.006 I common_perf_print:    graphs reused =          1",
    b"0.00.000.007 I c: adding speculative implementation 'draft-dspark'",
    b"0.00.000.008 D  - seq_id 0, draft candidate   0, pos   0:      1 (   0.500) 'b'",
    b"0.00.000.009 D spec common_specu: called impl draft-dspark, hist size = 1, call_count = 1, gen = 1",
    b"0.00.000.010 D accepted 1/1 draft tokens, the last target token is: (0)",
    b"0.00.000.011 I encoded    2 tokens in    0.001 seconds, speed: 2000.000 t/s",
    b"0.00.000.012 I decoded    2 tokens in    0.001 seconds, speed: 2000.000 t/s",
    b"0.00.000.013 I spec common_specu: statistics     draft-dspark: #calls(b,g,a) =    1      1"
    b"      1, #gen drafts =      1, #acc drafts =     1, #gen tokens =      1, #acc tokens =     1"
    b", #mean acc len = 2.00, #acc rate/pos = (1.000)",
    b"0.00.000.014 I n_predict = 2", b"0.00.000.014 I n_drafted = 1", b"0.00.000.014 I n_accept  = 1",
])
_LOGS = st.lists(_LINES | st.binary(max_size=80), max_size=30).map(lambda xs: b"\n".join(xs))


@fuzz_settings(300)
@given(log=_LOGS | st.binary(max_size=400))
def test_the_parsers_refuse_any_bytes_with_113_or_read_them(log):
    """Lines of llama.cpp's, in any order, and any bytes among them: read, cut, or refused
    with EngineOutputError; never another exception."""
    import io

    vocab = L.Vocabulary((b"a", b"b"), (b"a", b"b"))
    for read in (lambda: L.read_completion_log(io.BytesIO(log).read, prompt="ab", vocab=vocab,
                                               max_new_tokens=4),
                 lambda: L.read_speculative_log(io.BytesIO(log).read, (0, 0),
                                                spec_type="draft-dspark", vocab=vocab, n_max=2,
                                                max_new_tokens=4)):
        try:
            read()
        except EngineOutputError:
            pass


# --- the target GGUF, checked as export checks it ------------------------------------------------

@pytest.mark.parametrize("change, needle", [
    ({"layers": 12}, "'qwen3.block_count' is 12"),
    ({"change_embedding": True}, "tensor 'token_embd.weight' has SHA-256"),
])
def test_eval_refuses_a_target_gguf_of_another_target_before_running(tmp_path, paired_artifacts,
                                                                    change, needle):
    bad = write_target_gguf(tmp_path / "other.gguf", **change)
    proc = run_cli("eval", str(paired_artifacts[DSPARK]), "--target", str(GOLDEN_TARGET),
                   "--engine", f"llama.cpp={engine().bin}", "--target-gguf", str(bad),
                   "-o", str(tmp_path / "report"))
    assert_refused(proc, TargetGGUFMismatchError, [needle])
    assert not (tmp_path / "report").exists()
    # What `dspark export` says of the same file.
    out = run_cli("export", str(paired_artifacts[DSPARK]), "--engine", "llama.cpp", "--target-gguf", str(bad),
                  "-o", str(tmp_path / "d.gguf"))
    assert_refused(out, TargetGGUFMismatchError, [needle])


def test_an_interrupt_while_the_log_is_read_ends_the_engine_at_once(tmp_path):
    """Ctrl-C (or a bug) inside the log's reader stops the engine process: it is not
    waited for until its timeout (a real process that would sleep 60 s)."""
    def interrupted(log):
        raise KeyboardInterrupt

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        L._run(Path("/bin/sleep"), ["60"], "a sleeping run", interrupted, log_bytes=1 << 20,
               out_limit=1 << 20, timeout=60)
    assert time.monotonic() - t0 < 10
