"""`dspark profile`: a target's cost table measured on the real golden targets (Qwen3 and
Gemma4), read back by the cost table's own strict reader and checked against its schema;
what each measurement runs (one prefill, then per B the warm-up and timed verify forwards
of B tokens, each after the same context); every bad option one line with its own code and
nothing written; the --tokens parser fuzzed."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from support.cli import assert_refused, run_cli, run_process, temp_siblings
from support.fuzz import fuzz_settings
from support.gemma4 import GEMMA4_TARGET
from support.json_schema import schema_problems
from support.paths import GOLDEN_TARGET, ROOT
from dspark_convert.commands.binding import open_run_target, runtime_of
from dspark_convert.errors import (
    DeviceUnavailableError,
    OutputExistsError,
    OutputPathError,
    ProfileInputError,
    ProfileRangeError,
    TargetNotFoundError,
)
from dspark_convert.scheduling.cost_table import read_cost_table
from dspark_convert.scheduling.profile import (
    default_tokens,
    parse_tokens,
    profile_target,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TARGETS = {"qwen3": GOLDEN_TARGET, "gemma4": GEMMA4_TARGET}
SCHEMA = json.loads((ROOT / "schemas" / "cost_table.schema.json").read_text())


def _load(directory, dtype=torch.float32):
    opened = open_run_target(directory)
    runtime = runtime_of(opened.family)
    plan = runtime.plan_for(opened)
    return runtime.Target(plan.directory, device=torch.device("cpu"), dtype=dtype, plan=plan)


@pytest.fixture(scope="module", params=sorted(TARGETS))
def target(request):
    return _load(TARGETS[request.param])


def test_the_schema_check_refuses_what_the_schema_refuses():
    good = {"tokens": [1], "steps_per_second": [2.0], "device": "cpu", "dtype": "float32",
            "threads": 1, "versions": {"torch": "2"}}
    assert schema_problems(good, SCHEMA) == []
    for bad in ({**good, "extra": 1}, {**good, "tokens": [1.5]}, {**good, "threads": "1"},
                {**good, "versions": {"torch": 2}},
                {k: v for k, v in good.items() if k != "device"}):
        assert schema_problems(bad, SCHEMA), bad


# --- the staircase of B ------------------------------------------------------------------

def test_default_tokens_is_every_b_to_16_then_four_per_doubling_ending_at_max():
    assert default_tokens(64) == (*range(1, 17), 20, 24, 28, 32, 40, 48, 56, 64)
    assert default_tokens(1) == (1,)
    assert default_tokens(10) == tuple(range(1, 11))
    assert default_tokens(16) == tuple(range(1, 17))
    assert default_tokens(17) == (*range(1, 17), 17)
    assert default_tokens(1024)[-8:] == (320, 384, 448, 512, 640, 768, 896, 1024)
    assert default_tokens(1000)[-3:] == (768, 896, 1000)
    assert len(default_tokens(1024)) == 16 + 4 * 6


@given(st.integers(1, 100_000))
@fuzz_settings(200)
def test_default_tokens_is_a_cost_tables_tokens_ending_at_max(max_tokens):
    tokens = default_tokens(max_tokens)
    assert tokens[-1] == max_tokens and tokens[0] == 1
    assert all(a < b for a, b in zip(tokens, tokens[1:]))
    # never more than 1 .. 16 and four points per doubling (plus the end)
    assert len(tokens) <= 16 + 4 * max(0, math.ceil(math.log2(max_tokens / 16))) + 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_default_tokens_refuses_a_max_below_one(bad):
    with pytest.raises(ProfileInputError, match="--max-tokens: expected an integer >= 1"):
        default_tokens(bad)


# --- the --tokens parser -----------------------------------------------------------------

@pytest.mark.parametrize("text, needle", [
    ("", "entry 1 is empty"),
    ("1,,2", "entry 2 is empty"),
    ("1,2,", "entry 3 is empty"),
    ("4,2", "entry 2: expected strictly increasing positive integers, found 2 after 4"),
    ("1,1", "entry 2: expected strictly increasing positive integers, found 1 after 1"),
    ("0,1", "entry 1: expected strictly increasing positive integers, found 0"),
    ("-3", "entry 1: expected strictly increasing positive integers, found -3"),
    ("1,two", "entry 2: expected an integer, found 'two'"),
    ("1.5", "entry 1: expected an integer, found '1.5'"),
    ("9" * 5000, "entry 1: an integer of 5000 digits"),
])
def test_parse_tokens_refuses_each_bad_list_naming_the_entry(text, needle):
    with pytest.raises(ProfileInputError) as info:
        parse_tokens(text)
    assert needle in info.value.message and info.value.exit_code == 144
    assert "\n" not in info.value.message and len(info.value.message) < 300


@given(st.lists(st.integers(1, 10**12), min_size=1, max_size=30, unique=True),
       st.sampled_from([",", ", ", " ,"]))
@fuzz_settings(300)
def test_parse_tokens_reads_back_any_increasing_list(values, sep):
    values = sorted(values)
    assert parse_tokens(sep.join(map(str, values))) == tuple(values)


@given(st.text(alphabet=st.sampled_from("0123456789,- +.x\n\u0660"), max_size=40) | st.text(max_size=40))
@fuzz_settings(500)
def test_parse_tokens_gives_a_cost_tables_tokens_or_one_refusal(text):
    try:
        tokens = parse_tokens(text)
    except ProfileInputError as exc:
        assert "\n" not in exc.message and exc.message.startswith("--tokens: ")
        return
    assert tokens and all(isinstance(b, int) and b >= 1 for b in tokens)
    assert all(a < b for a, b in zip(tokens, tokens[1:]))


# --- the measurement ---------------------------------------------------------------------

def test_profile_target_measures_each_b_and_records_where(target):
    table = profile_target(target, tokens=[1, 3, 8], context=8, repeats=2, warmup=1)
    assert table.tokens == (1, 3, 8)
    assert all(math.isfinite(r) and r > 0 for r in table.steps_per_second)
    assert table.device.startswith("cpu (") and table.dtype == "float32"
    assert table.threads == torch.get_num_threads() == 1
    assert set(table.versions) == {"torch", "dspark-convert", "python"}
    assert table.versions["torch"] == torch.__version__


def test_each_b_is_one_packed_verify_of_blocks_after_the_same_context(target):
    """What profile_target runs on the real target: one prefill of the context, then per B
    warm-up + repeats packed forwards of B tokens in requests' blocks of at most `segment`,
    each block starting at the context's end in a cache of its own, keeping no hidden state,
    with every row's logits."""
    calls = []
    real, real_packed = target.forward, target.forward_packed

    inside = []        # forward runs through forward_packed: record the outer call only

    def forward(ids, cache, **kw):
        inside.append(1)
        out = real(ids, cache, **kw)
        inside.pop()
        calls.append(("forward", len(ids), cache.length - len(ids), kw, tuple(out.logits.shape)))
        return out

    def forward_packed(segments, **kw):
        if inside:
            return real_packed(segments, **kw)
        starts = [cache.length for _, cache in segments]
        outs = real_packed(segments, **kw)
        calls.append(("packed", [len(ids) for ids, _ in segments], starts, kw,
                      [tuple(o.logits.shape) for o in outs]))
        return outs

    target.forward, target.forward_packed = forward, forward_packed
    try:
        profile_target(target, tokens=[2, 5], context=6, repeats=3, warmup=2, segment=2)
    finally:
        del target.forward, target.forward_packed
    vocab = target.config.vocab_size
    assert calls[0] == ("forward", 6, 0, {"keep": (), "last_logits_only": True}, (1, vocab))
    blocks = {2: [2], 5: [2, 2, 1]}
    assert calls[1:] == [("packed", blocks[b], [6] * len(blocks[b]), {"keep": ()},
                          [(n, vocab) for n in blocks[b]]) for b in (2, 5) for _ in range(5)]


def test_a_long_context_is_prefilled_in_chunks(target):
    """A context of 300 tokens is prefilled 256 tokens a forward (the attention scores of one
    300-token forward are never held), and every B is still measured after all 300."""
    calls = []
    real, real_packed = target.forward, target.forward_packed

    inside = []

    def forward(ids, cache, **kw):
        calls.append((len(ids), cache.length))
        inside.append(1)
        try:
            return real(ids, cache, **kw)
        finally:
            inside.pop()

    def forward_packed(segments, **kw):
        if not inside:
            calls.append(tuple((len(ids), cache.length) for ids, cache in segments))
        return real_packed(segments, **kw)

    target.forward, target.forward_packed = forward, forward_packed
    try:
        table = profile_target(target, tokens=[1, 4], context=300, repeats=1, warmup=0)
    finally:
        del target.forward, target.forward_packed
    assert calls == [(256, 0), (44, 256), ((1, 300),), ((4, 300),)] and table.tokens == (1, 4)


def test_profile_target_records_bfloat16():
    table = profile_target(_load(GOLDEN_TARGET, torch.bfloat16), tokens=[1, 2], context=4,
                           repeats=1)
    assert table.dtype == "bfloat16" and table.tokens == (1, 2)


def test_profile_target_refuses_before_any_forward(target):
    positions = target.config.max_position_embeddings
    with pytest.raises(ProfileRangeError, match=f"max_position_embeddings {positions}"):
        profile_target(target, tokens=[1, positions], context=positions - 7)
    for kwargs, needle in (({"tokens": []}, "--tokens"), ({"tokens": [2, 1]}, "--tokens"),
                           ({"tokens": [1], "context": 0}, "--context"),
                           ({"tokens": [1], "repeats": 0}, "--repeats"),
                           ({"tokens": [1], "warmup": -1}, "warmup")):
        with pytest.raises(ProfileInputError, match=needle):
            profile_target(target, **kwargs)


# --- the command -------------------------------------------------------------------------

@pytest.mark.parametrize("family", sorted(TARGETS))
def test_profile_writes_a_cost_table_its_reader_and_schema_accept(tmp_path, family):
    out = tmp_path / "cost.json"
    proc = run_cli("profile", "--target", str(TARGETS[family]), "-o", str(out),
                   "--tokens", "1,2,4,8", "--context", "8", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr
    table = read_cost_table(out)
    assert table.tokens == (1, 2, 4, 8) and all(r > 0 for r in table.steps_per_second)
    assert table.device.startswith("cpu") and table.dtype == "float32" and table.threads >= 1
    assert schema_problems(json.loads(out.read_text()), SCHEMA) == []
    assert f"wrote {out}" in proc.stdout and proc.stdout.count("\n") >= 4
    assert temp_siblings(out) == []


def test_profile_json_is_the_table_and_the_settings(tmp_path):
    out = tmp_path / "cost.json"
    proc = run_cli("profile", "--target", str(GOLDEN_TARGET), "-o", str(out), "--max-tokens",
                   "20", "--context", "4", "--repeats", "1", "--dtype", "bfloat16", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["output"] == str(out) and doc["context"] == 4
    assert doc["table"]["tokens"] == [*range(1, 17), 20] == list(default_tokens(20))
    assert doc["table"] == json.loads(out.read_text())
    assert doc["table"]["dtype"] == "bfloat16"


def test_profile_fills_the_context_exactly(tmp_path):
    """context + a block (--segment 8) equal to max_position_embeddings (512) fits, with a B
    of 24 (three blocks, each at its own positions); one more is 145."""
    out = tmp_path / "cost.json"
    proc = run_cli("profile", "--target", str(GOLDEN_TARGET), "-o", str(out), "--tokens",
                   "12,24", "--context", "504", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr
    assert read_cost_table(out).tokens == (12, 24)


def test_force_replaces_a_cost_table(tmp_path):
    out = tmp_path / "cost.json"
    out.write_text("old")
    proc = run_cli("profile", "--target", str(GOLDEN_TARGET), "-o", str(out), "--tokens", "3",
                   "--context", "2", "--repeats", "1", "--force")
    assert proc.returncode == 0, proc.stderr
    assert read_cost_table(out).tokens == (3,)


_COMMON = ("--context", "4", "--repeats", "1")
REFUSALS = [
    # (case, args (after --target T -o OUT), error class, needle)
    ("tokens-decreasing", ("--tokens", "8,4", *_COMMON), ProfileInputError,
     "--tokens: entry 2: expected strictly increasing positive integers, found 4 after 8"),
    ("tokens-repeated", ("--tokens", "2,2", *_COMMON), ProfileInputError, "found 2 after 2"),
    ("tokens-zero", ("--tokens", "0", *_COMMON), ProfileInputError, "found 0"),
    ("tokens-negative", ("--tokens", "-4", *_COMMON), ProfileInputError, "found -4"),
    ("tokens-empty", ("--tokens", "", *_COMMON), ProfileInputError, "entry 1 is empty"),
    ("tokens-empty-entry", ("--tokens", "1,,4", *_COMMON), ProfileInputError, "entry 2 is empty"),
    ("tokens-word", ("--tokens", "1,eight", *_COMMON), ProfileInputError,
     "expected an integer, found 'eight'"),
    ("tokens-huge-number", ("--tokens", "9" * 5000, *_COMMON), ProfileInputError,
     "an integer of 5000 digits"),
    ("tokens-and-max-tokens", ("--tokens", "1,2", "--max-tokens", "4", *_COMMON),
     ProfileInputError, "--tokens and --max-tokens: expected one of them, found both"),
    ("max-tokens-zero", ("--max-tokens", "0", *_COMMON), ProfileInputError,
     "--max-tokens: expected an integer >= 1, found 0"),
    ("context-zero", ("--tokens", "1", "--context", "0"), ProfileInputError,
     "--context: expected an integer >= 1, found 0"),
    ("repeats-zero", ("--tokens", "1", "--repeats", "0"), ProfileInputError,
     "--repeats: expected an integer >= 1, found 0"),
    ("repeats-negative", ("--tokens", "1", "--repeats", "-2"), ProfileInputError,
     "--repeats: expected an integer >= 1, found -2"),
    ("dtype-unknown", ("--tokens", "1", "--dtype", "float16"), ProfileInputError,
     "--dtype: expected one of float32, bfloat16, found 'float16'"),
    ("device-unknown", ("--tokens", "1", "--device", "tpu"), ProfileInputError,
     "--device: expected one of auto, cpu, cuda, found 'tpu'"),
    ("segment-zero", ("--tokens", "1", "--segment", "0"), ProfileInputError,
     "--segment: expected an integer >= 1, found 0"),
    ("requests-zero", ("--tokens", "1", "--requests", "0"), ProfileInputError,
     "--requests: expected an integer >= 1, found 0"),
    ("requests-block-beyond-context", ("--tokens", "64", "--requests", "4", "--context", "500"),
     ProfileRangeError, "a context of 500 tokens plus a block of 16 = 516 positions"),
    # the golden targets hold 512 positions
    ("segment-beyond-context", ("--tokens", "16", "--segment", "16", "--context", "500"),
     ProfileRangeError, "a context of 500 tokens plus a block of 16 = 516 positions; expected "
     "at most the target's max_position_embeddings 512"),
    ("context-plus-block-beyond", ("--tokens", "13", "--context", "505"), ProfileRangeError,
     "= 513 positions"),
    ("max-tokens-beyond-context", ("--max-tokens", "512", "--context", "505"), ProfileRangeError,
     "= 513 positions"),
    ("max-tokens-over-the-bound", ("--max-tokens", "65537", *_COMMON), ProfileRangeError,
     "a batch of 65537 tokens; expected at most 65536"),
    # 4,300-digit numbers (the most parse_int takes; str() of a larger int raises): named
    # by their size, never printed or converted
    ("max-tokens-huge", ("--max-tokens", "9" * 4300, *_COMMON), ProfileRangeError,
     "a batch of an integer of 14285 bits tokens"),
    ("context-huge", ("--tokens", "1", "--context", "9" * 4300), ProfileRangeError,
     "a context of an integer of 14285 bits tokens plus a block of 1 ="),
    ("tokens-huge-then-small", ("--tokens", "9" * 4300 + ",1", *_COMMON), ProfileInputError,
     "found 1 after an integer of 14285 bits"),
]


@pytest.mark.parametrize("family", sorted(TARGETS))
@pytest.mark.parametrize("case, args, error, needle", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_bad_option_is_one_line_its_code_and_nothing_written(tmp_path, family, case, args,
                                                                    error, needle):
    out = tmp_path / "cost.json"
    proc = run_cli("profile", "--target", str(TARGETS[family]), "-o", str(out), *args)
    assert_refused(proc, error, [needle])
    assert not os.path.lexists(out) and temp_siblings(out) == []
    assert os.listdir(tmp_path) == []


def test_refusals_with_json_are_one_json_error(tmp_path):
    out = tmp_path / "cost.json"
    proc = run_cli("profile", "--target", str(GOLDEN_TARGET), "-o", str(out), "--tokens",
                   "3,2", "--json")
    assert_refused(proc, ProfileInputError)
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 144 and doc["field"] == "tokens"


def test_an_existing_output_is_refused_and_untouched(tmp_path):
    out = tmp_path / "cost.json"
    out.write_text("mine")
    proc = run_cli("profile", "--target", str(GOLDEN_TARGET), "-o", str(out), "--tokens", "1")
    assert_refused(proc, OutputExistsError, ["cost.json"])
    assert out.read_text() == "mine" and temp_siblings(out) == []


@pytest.mark.parametrize("where, error", [("inside", OutputExistsError), ("empty", OutputPathError)])
def test_an_output_the_rule_refuses_is_refused_before_the_target_is_read(tmp_path, where, error):
    target = tmp_path / "target"
    target.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (target / name).write_bytes((GOLDEN_TARGET / name).read_bytes())
    before = sorted(os.listdir(target))
    out = str(target / "cost.json") if where == "inside" else ""
    proc = run_cli("profile", "--target", str(target), "-o", out, "--tokens", "1")
    assert_refused(proc, error)
    assert sorted(os.listdir(target)) == before


def test_a_missing_target_is_refused(tmp_path):
    out = tmp_path / "cost.json"
    proc = run_cli("profile", "--target", str(tmp_path / "nothing"), "-o", str(out), "--tokens",
                   "1")
    assert_refused(proc, TargetNotFoundError, ["nothing"])
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_refused(tmp_path):
    out = tmp_path / "cost.json"
    proc = run_cli("profile", "--target", str(GOLDEN_TARGET), "-o", str(out), "--tokens", "1",
                   "--device", "cuda")
    assert_refused(proc, DeviceUnavailableError, ["--device cuda"])
    assert not out.exists()


@pytest.mark.slow
def test_profile_as_a_process(tmp_path):
    """The console script: a refusal is one line and its code; a run writes the table."""
    out = tmp_path / "cost.json"
    proc = run_process("profile", "--target", str(GEMMA4_TARGET), "-o", str(out), "--tokens",
                       "4,1")
    assert_refused(proc, ProfileInputError, ["found 1 after 4"])
    assert not out.exists()
    proc = run_process("profile", "--target", str(GEMMA4_TARGET), "-o", str(out), "--tokens",
                       "1,16", "--context", "16", "--repeats", "2")
    assert proc.returncode == 0, proc.stderr
    assert read_cost_table(out).tokens == (1, 16)


def test_a_hub_target_pinned_by_commit_is_profiled(tmp_path, monkeypatch):
    """--target org/name@<commit>, as smoke and eval take it: fetched from a loopback Hub
    (tests/support/hub_server.py, the real huggingface_hub client); a branch is refused."""
    from support.hub_server import HubServer

    from dspark_convert.errors import HubSpecError

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    with HubServer() as server:
        commit = server.add_directory("org/tiny-qwen3", GOLDEN_TARGET)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        out = tmp_path / "cost.json"
        proc = run_cli("profile", "--target", "org/tiny-qwen3@main", "-o", str(out),
                       "--tokens", "2", "--context", "2", "--repeats", "1")
        assert_refused(proc, HubSpecError, ["branch or tag"])
        assert not out.exists()
        proc = run_cli("profile", "--target", f"org/tiny-qwen3@{commit}", "-o", str(out),
                       "--tokens", "1,2", "--context", "2", "--repeats", "1", "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["target"] == f"org/tiny-qwen3@{commit}"
        assert read_cost_table(out).tokens == (1, 2)


@pytest.mark.slow   # a real profile process on a pty, started and interrupted (~4 s)
def test_a_real_sigint_mid_profile_writes_nothing(tmp_path):
    """A child `dspark profile` on a terminal (its progress bar is labelled "profile"); SIGINT
    once it is measuring: exit 130, one error line saying nothing was written, no table and
    no temporary beside it."""
    import subprocess

    from support.cli import child_env, dspark_cmd, interrupt_on_terminal

    out = tmp_path / "cost.json"
    cmd = dspark_cmd("profile", "--target", str(GOLDEN_TARGET), "-o", str(out), "--max-tokens",
                     "448", "--repeats", "200", "--device", "cpu")
    proc, seen, sent = interrupt_on_terminal(cmd, b"profile", seconds=120,
                                             stdout=subprocess.PIPE,
                                             env=child_env({"OMP_NUM_THREADS": "1"}))
    stdout = proc.stdout.read().decode()
    proc.stdout.close()
    assert sent, f"the profile never started: {seen[-400:]!r}"
    assert proc.wait() == 130, (stdout, seen[-800:])
    text = seen.decode(errors="replace")
    errors = [line for line in text.replace("\r", "\n").splitlines() if "error:" in line]
    assert len(errors) == 1 and "interrupted; nothing was written" in errors[0], errors
    assert "Traceback" not in text and stdout == ""
    assert os.listdir(tmp_path) == []


def test_requests_spread_each_b_over_r_blocks(target):
    """--requests R: a step of B tokens is R requests' blocks, B spread evenly (the table of
    a concurrency of R); a B below R is B requests of one token; the table says so."""
    from dspark_convert.scheduling.profile import blocks_of

    assert blocks_of(10, 8, 4) == [3, 3, 2, 2] and blocks_of(3, 8, 4) == [1, 1, 1]
    assert blocks_of(16, 8) == [8, 8] and blocks_of(17, 8) == [8, 8, 1]
    seen = []
    real = target.forward_packed

    def forward_packed(segments, **kw):
        seen.append([len(ids) for ids, _ in segments])
        return real(segments, **kw)

    target.forward_packed = forward_packed
    try:
        table = profile_target(target, tokens=[4, 9], context=4, repeats=1, warmup=0,
                               requests=4)
    finally:
        del target.forward_packed
    assert seen[-2:] == [[1, 1, 1, 1], [3, 2, 2, 2]] and table.requests == 4
    assert profile_target(target, tokens=[1], context=4, repeats=1).requests is None
