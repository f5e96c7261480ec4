"""Hostile values through the CLI: floats, JSON reports and messages, each
example through the real CLI (tests/support/cli.py), with the twins found in other commands:

- Exit 1: a tiny positive temperature and a drafter whose forward overflows (runtime/
  sampling.py, the one float rule); eval with a prompt that ends at its first token (no
  verify step: the plots); a manifest string holding a lone surrogate (validate refuses it
  before quantize copies it).
- False PASS / false report: a quantized artifact's manifest claiming impossible errors, a
  wrong parent size, another quantizer; quantize reads the parent's manifest once; no JSON
  output holds NaN (util/json_out.py); calibration.json's strict types; --heads on a drafter
  without head matrices; smoke's tau undefined, not 0; an interrupted eval's reasons.
- Unclear errors: a branch as --target; one seed rule; --prompt not UTF-8; 5,000-digit
  integers on the command line and in JSON files; a Q4_1 matrix in a Q8_0 artifact; usage
  errors with --json.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hostile import make_corpus
from support.cli import assert_refused, run_cli
from support.paths import GOLDEN, GOLDEN_TARGET, REFERENCE_TRACE

from dspark_convert import errors as E

PLAIN = GOLDEN / "synthetic" / "dflash_plain"
TARGET = str(GOLDEN_TARGET)
# On the golden target the greedy next token after [1, 471] is EOS: no verify step runs.
EOS_PROMPT = "1,471"
PROMPT = "1,471,200"
HUGE = "9" * 5000


def _json(proc) -> dict:
    """stdout as strict JSON (json.loads with NaN/Infinity refused)."""
    def refuse(name):
        raise AssertionError(f"not JSON: {name} in the output")
    return json.loads(proc.stdout, parse_constant=refuse)


def _edit_manifest(art: Path, edit) -> None:
    path = art / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m, indent=2) + "\n")


@pytest.fixture(scope="module")
def dspark_art(paired_artifacts) -> Path:
    return paired_artifacts["vanilla_conf_markov"]


@pytest.fixture(scope="module")
def q8(tmp_path_factory, dspark_art) -> Path:
    out = tmp_path_factory.mktemp("q8") / "q8"
    proc = run_cli("quantize", str(dspark_art), "-o", str(out), "--type", "q8_0", "-q")
    assert proc.returncode == 0, proc.stderr
    return out


# --- class 2: exit 1 ------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [   # one canary in the fast loop (~1.5 s each)
    "3e-38", pytest.param("1e-300", marks=pytest.mark.slow),
    pytest.param("5e-324", marks=pytest.mark.slow)])
def test_a_tiny_temperature_samples_instead_of_crashing(dspark_art, temperature):
    """z / T overflows float32 below ~1e-37: the float64 path on the gaps to the maximum
    gives the limit of softmax(z/T), the argmax, so the output is the greedy one."""
    proc = run_cli("smoke", str(dspark_art), "--target", TARGET, "--prompt-ids", PROMPT,
                   "--max-new-tokens", "8", "--temperature", temperature, "--json")
    assert proc.returncode == 0, proc.stderr
    greedy = run_cli("smoke", str(dspark_art), "--target", TARGET, "--prompt-ids", PROMPT,
                     "--max-new-tokens", "8", "--json")
    assert _json(proc)["runs"][0]["output_ids"] == _json(greedy)["runs"][0]["output_ids"]


@pytest.mark.slow   # an eval run (~5 s)
def test_eval_takes_a_tiny_temperature(tmp_path, dspark_art):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, 471, 200]}\n')
    proc = run_cli("eval", str(dspark_art), "--target", TARGET, "--prompts", str(prompts),
                   "-o", str(tmp_path / "r"), "--max-new-tokens", "6", "--temperature", "3e-38",
                   "--threshold", "0.5")
    assert proc.returncode == 0, proc.stderr
    _json_file(tmp_path / "r" / "report.json")


@pytest.mark.parametrize("command", ["smoke", "eval"])
@pytest.mark.parametrize("temperature", ["nan", "inf", "-1e-9", "100.5"])
def test_one_temperature_rule(tmp_path, dspark_art, command, temperature):
    """Not 0 and not in (0, 100]: the same words and each command's own option code (smoke
    refused these as a usage error, eval as 91)."""
    error = E.SmokeInputError if command == "smoke" else E.EvalInputError
    args = (["smoke", str(dspark_art), "--target", TARGET, "--prompt-ids", PROMPT]
            if command == "smoke" else ["eval", str(dspark_art), "--target", TARGET, "-o",
                                        str(tmp_path / "r")])
    proc = run_cli(*args, "--temperature", temperature)
    assert_refused(proc, error, ["--temperature: expected 0 (greedy) or a number in (0, 100]"])


def _overflowing_drafter(root: Path) -> Path:
    """The golden DSpark drafter with its final norm at 3e38 (finite BF16, so convert and
    validate --target pass it), converted with --target: its logits overflow float32."""
    import torch
    from safetensors.torch import load_file, save_file

    from dspark_convert.commands.convert import convert

    src = root / "src"
    shutil.copytree(GOLDEN / "reference" / "vanilla_conf_markov" / "draft", src)
    tensors = load_file(str(src / "model.safetensors"))
    tensors["norm.weight"] = torch.full_like(tensors["norm.weight"], 3.0e38)
    (src / "model.safetensors").unlink()
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    convert(src, root / "art", target=GOLDEN_TARGET)
    return root / "art"


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory) -> Path:
    return _overflowing_drafter(tmp_path_factory.mktemp("overflow"))


def test_an_overflowing_drafter_validates(overflowing):
    assert run_cli("validate", str(overflowing), "--target", TARGET).returncode == 0


@pytest.mark.parametrize("temperature", ["1", pytest.param("0", marks=pytest.mark.slow)])
def test_an_overflowing_drafter_is_refused_by_smoke(overflowing, temperature):
    proc = run_cli("smoke", str(overflowing), "--target", TARGET, "--prompt-ids", PROMPT,
                   "--max-new-tokens", "8", "--temperature", temperature, "--json")
    line = assert_refused(proc, E.NumericOverflowError, ["the drafter's logits", "non-finite"])
    assert _json(proc)["error"] == "NumericOverflowError", line


def test_an_overflowing_drafter_is_refused_by_eval(tmp_path, overflowing):
    out = tmp_path / "r"
    proc = run_cli("eval", str(overflowing), "--target", TARGET, "-o", str(out),
                   "--max-new-tokens", "6", "--temperature", "1")
    assert_refused(proc, E.NumericOverflowError, ["the drafter's logits"])
    assert not out.exists()


@pytest.mark.slow  # a whole eval run: make test; the fast loop keeps the tiny-temperature run
def test_eval_on_a_prompt_without_a_verify_step(tmp_path, dspark_art):
    """[1, 471]: the target's first token is EOS; tau is undefined (null) and every plot
    is written (the acceptance plot used to format tau None)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, 471]}\n{"id": "b", "prompt_ids": [1, 471]}\n')
    out = tmp_path / "r"
    proc = run_cli("eval", str(dspark_art), "--target", TARGET, "--prompts", str(prompts),
                   "-o", str(out), "--max-new-tokens", "8", "--calibrate", "--threshold", "0.5")
    assert proc.returncode == 0, proc.stderr
    assert "tau undefined (no verify step ran)" in proc.stdout
    report = _json_file(out / "report.json")
    drafter = [r for r in report["runs"] if r["kind"] == "drafter"]
    assert drafter and all(r["acceptance"]["tau"] is None for r in drafter)
    assert {"acceptance.png", "reliability-vanilla_conf_markov.png"} <= {
        p.name for p in out.iterdir()}


def _json_file(path: Path) -> dict:
    def refuse(name):
        raise AssertionError(f"{path}: not JSON: {name}")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_a_lone_surrogate_in_the_manifest_is_refused_by_validate(tmp_path, dspark_art):
    """A recorded check's detail is not compared with the file: a lone surrogate escape
    there passed validate and broke quantize's writer (exit 1)."""
    art = tmp_path / "art"
    shutil.copytree(dspark_art, art)
    m = json.loads((art / "manifest.json").read_text())
    detail = m["checks"][0]["detail"]
    text = (art / "manifest.json").read_text()
    assert json.dumps(detail) in text
    (art / "manifest.json").write_text(text.replace(json.dumps(detail),
                                                    json.dumps(detail)[:-1] + '\\ud800"', 1))
    proc = run_cli("validate", str(art), "--json")
    assert proc.returncode == E.ManifestError.exit_code, proc.stderr
    assert "checks[0].detail" in proc.stderr and "surrogate" in proc.stderr
    out = tmp_path / "q"
    proc = run_cli("quantize", str(art), "-o", str(out), "--type", "q8_0")
    assert_refused(proc, E.ParentArtifactError, ["checks[0].detail", "surrogate"])
    assert not out.exists()


# --- class 3: false PASS and false reports --------------------------------------------------

def _first_quantized(m: dict) -> dict:
    return next(t for t in m["artifact"]["tensors"] if "error" in t)


@pytest.mark.parametrize("edit, field", [
    (lambda m: _first_quantized(m)["error"].update(max_abs=5.0), "error.max_abs"),
    (lambda m: _first_quantized(m)["error"].update(rel_rms=0.5), "error.rel_rms"),
    (lambda m: _first_quantized(m)["error"].update(max_abs=0.0), "error.rel_rms"),
    (lambda m: m["parent"]["files"][0].update(size=m["parent"]["files"][0]["size"] + 32),
     "parent.files[drafter.gguf].size"),
    (lambda m: m["quantization"].update(tool="llama-quantize b4500"), "quantization.tool"),
    (lambda m: m["parent"]["files"][0].update(sha256="0" * 64), "strata.dflash.source_sha256"),
], ids=["max-abs", "rel-rms", "zero-max-abs", "parent-size", "tool", "parent-sha256"])
def test_a_quantized_manifest_is_confirmed_against_the_file(tmp_path, q8, edit, field):
    art = tmp_path / "art"
    shutil.copytree(q8, art)
    _edit_manifest(art, edit)
    proc = run_cli("validate", str(art), "--json")
    assert proc.returncode in (E.ManifestMismatchError.exit_code, E.IntegrityError.exit_code)
    assert field in proc.stderr, proc.stderr


def test_a_real_quantized_manifest_passes_and_its_parent_size_is_exact(q8, dspark_art):
    assert run_cli("validate", str(q8)).returncode == 0
    parent = json.loads((q8 / "manifest.json").read_text())["parent"]["files"][0]
    assert parent["size"] == (dspark_art / "drafter.gguf").stat().st_size


@pytest.mark.parametrize("qtype", ["q5_0", "q4_0"])
def test_every_type_passes_its_own_error_bounds(tmp_path, dspark_art, qtype):
    out = tmp_path / qtype
    assert run_cli("quantize", str(dspark_art), "-o", str(out), "--type", qtype,
                   "-q").returncode == 0
    assert run_cli("validate", str(out)).returncode == 0


def test_quantize_uses_the_manifest_validate_read(tmp_path, dspark_art, monkeypatch):
    """The parent's manifest.json is swapped for another valid one right after validate
    read it: quantize goes on with what it checked (it re-read the file, and recorded the
    other's bytes)."""
    from dspark_convert.commands import quantize as quantize_module
    from dspark_convert.commands import validate as validate_module

    parent = tmp_path / "parent"
    shutil.copytree(dspark_art, parent)
    original = (parent / "manifest.json").read_bytes()
    real = validate_module.validate_artifact

    def validate_then_swap(path, **kw):
        report = real(path, **kw)
        _edit_manifest(Path(path), lambda m: m["source"].update(name="swapped"))
        return report

    monkeypatch.setattr(validate_module, "validate_artifact", validate_then_swap)
    out = tmp_path / "q"
    quantize_module.quantize_artifact(parent, out, "q8_0")
    import hashlib
    record = json.loads((out / "manifest.json").read_text())
    assert record["source"]["name"] != "swapped"
    assert record["parent"]["files"][1]["sha256"] == hashlib.sha256(original).hexdigest()


def test_heads_on_a_drafter_without_head_matrices_records_none(tmp_path):
    art, out = tmp_path / "plain", tmp_path / "q"
    assert run_cli("convert", str(PLAIN), "-o", str(art), "-q").returncode == 0
    proc = run_cli("quantize", str(art), "-o", str(out), "--type", "q8_0", "--heads", "q8_0")
    assert proc.returncode == 0, proc.stderr
    assert "(Q8_0; no head matrices)" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["quantization"]["heads"] is None
    # validate's twin: a manifest that records heads the drafter does not have
    _edit_manifest(out, lambda m: m["quantization"].update(heads="Q8_0"))
    proc = run_cli("validate", str(out))
    assert proc.returncode == E.ManifestMismatchError.exit_code
    assert "quantization.heads" in proc.stderr


def test_smoke_without_a_verify_step_says_tau_is_undefined(tmp_path, dspark_art):
    trace = tmp_path / "t.json"
    proc = run_cli("smoke", str(dspark_art), "--target", TARGET, "--prompt-ids", EOS_PROMPT,
                   "--max-new-tokens", "8", "--json", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    report = _json(proc)
    assert report["tau"] is None and report["runs"][0]["tau"] is None
    _json_file(trace)
    text = run_cli("smoke", str(dspark_art), "--target", TARGET, "--prompt-ids", EOS_PROMPT,
                   "--max-new-tokens", "8")
    assert "tau undefined (no verify step ran)" in text.stdout and "tau 0.000" not in text.stdout
    floor = run_cli("smoke", str(dspark_art), "--target", TARGET, "--prompt-ids", EOS_PROMPT,
                    "--max-new-tokens", "8", "--min-tau", "1")
    assert_refused(floor, E.AcceptanceFloorError, ["tau is undefined"])


@pytest.mark.slow   # an eval --calibrate run (~6 s)
def test_calibration_json_types_are_strict(tmp_path):
    from pydantic import ValidationError

    from dspark_convert.evaluation.calibration import CalibrationFile

    good = json.loads(_calibration_text(tmp_path))
    CalibrationFile.model_validate(good)
    for path, value in ((("decoding_temperature",), "1.0"), (("block_size",), 7.0),
                        (("block_size",), True), (("split", "seed"), 7.0),
                        (("temperatures",), ["1.0"]), (("target", "vocab_size"), "512"),
                        (("version",), True)):
        bad = json.loads(json.dumps(good))
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(ValidationError):
            CalibrationFile.model_validate(bad)


_CALIBRATION: dict[str, str] = {}


def _calibration_text(tmp_path: Path) -> str:
    """A real calibration.json: eval --calibrate on the golden drafter (4 prompts)."""
    if "text" not in _CALIBRATION:
        from support.paths import REFERENCE_PROMPTS

        from dspark_convert.commands.convert import convert

        art = tmp_path / "vanilla_conf_markov"
        convert(GOLDEN / "reference" / "vanilla_conf_markov" / "draft", art, target=GOLDEN_TARGET)
        prompts = tmp_path / "p.jsonl"
        prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt_ids": p}) + "\n"
                                   for i, p in enumerate(REFERENCE_PROMPTS * 2)))
        out = tmp_path / "r"
        proc = run_cli("eval", str(art), "--target", TARGET, "--prompts", str(prompts), "-o",
                       str(out), "--max-new-tokens", "12", "--calibrate", "--threshold", "0.5")
        assert proc.returncode == 0, proc.stderr
        _CALIBRATION["text"] = (out / "calibration-vanilla_conf_markov.json").read_text()
    return _CALIBRATION["text"]


@pytest.mark.slow   # the same eval --calibrate run
def test_calibration_json_with_a_string_number_is_refused_by_smoke(tmp_path, dspark_art):
    doc = json.loads(_calibration_text(tmp_path))
    doc["temperatures"][0] = str(doc["temperatures"][0])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    proc = run_cli("smoke", str(dspark_art), "--target", TARGET, "--prompt-ids", PROMPT,
                   "--calibration", str(bad), "--confidence-threshold", "0.5")
    assert_refused(proc, E.CalibrationFileError, ["temperatures.0", "a number"])


def test_an_interrupted_eval_keeps_the_reason_of_what_could_never_run(dspark_art, tmp_path):
    """A plain DFlash artifact beside a DSpark one, Ctrl-C during the first drafter run:
    the DFlash threshold runs could never run (no confidence head), whatever happened."""
    from dspark_convert.commands import evaluate
    from dspark_convert.runtime import speculative

    plain = tmp_path / "plain"
    from dspark_convert.commands.convert import convert
    convert(GOLDEN / "reference" / "dflash_shared" / "draft", plain, target=GOLDEN_TARGET)
    real = speculative.speculative_generate
    calls = {"n": 0}

    def interrupt_later(*args, **kw):
        calls["n"] += 1
        if calls["n"] > 3:          # after the warm-up of both drafters and one run
            raise KeyboardInterrupt
        return real(*args, **kw)

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, 471, 200]}\n')
    try:
        speculative.speculative_generate = interrupt_later
        with pytest.raises(evaluate.EvalInterrupted) as stop:
            evaluate.run_eval([dspark_art, plain], TARGET, prompts, thresholds=[0.5],
                              max_new_tokens=4, calibrate=True)
    finally:
        speculative.speculative_generate = real
    reasons = {(n.kind, n.artifact, n.confidence_threshold): n.reason
               for n in stop.value.report.not_run}
    assert "no confidence head" in reasons[("drafter", "plain", 0.5)]
    assert "no confidence head" in reasons[("calibration", "plain", 0.0)]
    assert reasons[("drafter", "vanilla_conf_markov", 0.5)].startswith("interrupted")


# --- the one JSON writer ----------------------------------------------------------------------

def test_inspect_json_of_a_nan_metadata_value_is_json(tmp_path, dspark_art):
    """A NaN rope theta (refused, 17): the error object names it as text."""
    from gguf import GGUFValueType

    art = tmp_path / "art"
    shutil.copytree(dspark_art, art)
    make_corpus.rewrite_gguf_key("dflash.rope.frequency_base", float("nan"),
                                 GGUFValueType.FLOAT64)(art)
    for command in ("inspect", "validate"):
        proc = run_cli(command, str(art), "--json")
        assert proc.returncode == E.GeometryLimitError.exit_code, proc.stderr
        doc = _json(proc)
        assert "nan" in json.dumps(doc)


# --- class 6: unclear errors ----------------------------------------------------------------

@pytest.mark.parametrize("command", ["smoke", "eval", "validate"])
def test_a_branch_as_target_names_what_the_command_takes(tmp_path, dspark_art, command):
    args = {"smoke": ["smoke", str(dspark_art), "--prompt-ids", PROMPT],
            "eval": ["eval", str(dspark_art), "-o", str(tmp_path / "r")],
            "validate": ["validate", str(dspark_art)]}[command]
    proc = run_cli(*args, "--target", "org/name@main", env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == E.HubSpecError.exit_code, proc.stderr
    assert "pass --resolve" not in proc.stderr
    assert "org/name@<40-hex commit>" in proc.stderr and "dspark lock" in proc.stderr


@pytest.mark.parametrize("seed, ok", [pytest.param(2 ** 63, True, marks=pytest.mark.slow),
                                      pytest.param(2 ** 64 - 1, True, marks=pytest.mark.slow),
                                      (2 ** 64, False)])
def test_one_seed_rule_for_smoke_and_eval(tmp_path, dspark_art, seed, ok):
    smoke = run_cli("smoke", str(dspark_art), "--target", TARGET, "--prompt-ids", PROMPT,
                    "--max-new-tokens", "4", "--temperature", "1", "--seed", str(seed))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, 471, 200]}\n')
    ev = run_cli("eval", str(dspark_art), "--target", TARGET, "--prompts", str(prompts), "-o",
                 str(tmp_path / "r"), "--max-new-tokens", "4", "--temperature", "1",
                 "--threshold", "0.5", "--seed", str(seed))
    if ok:
        assert smoke.returncode == 0 and ev.returncode == 0, smoke.stderr + ev.stderr
    else:
        assert_refused(smoke, E.SmokeInputError, ["--seed: expected 0..2^64-1"])
        assert_refused(ev, E.EvalInputError, ["--seed: expected 0..2^64-1"])


def test_a_prompt_that_is_not_utf8(dspark_art):
    text = b"ab\xff\xfe".decode("utf-8", "surrogateescape")   # what argv holds
    proc = run_cli("smoke", str(dspark_art), "--target", TARGET, "--prompt", text)
    assert_refused(proc, E.SmokeInputError, ["--prompt: not UTF-8 text (byte 0xff"])


@pytest.mark.parametrize("command, option", [   # eval's prompts are a file: the JSON case below
    ("smoke", "--seed"), ("smoke", "--max-new-tokens"), ("smoke", "--prompt-ids"),
    ("eval", "--seed"), ("eval", "--max-new-tokens")])
def test_a_5000_digit_integer_option(tmp_path, dspark_art, command, option):
    value = ("1," + HUGE) if option == "--prompt-ids" else HUGE
    args = (["smoke", str(dspark_art), "--target", TARGET] +
            ([] if option == "--prompt-ids" else ["--prompt-ids", PROMPT])
            if command == "smoke" else ["eval", str(dspark_art), "--target", TARGET, "-o",
                                        str(tmp_path / "r")])
    proc = run_cli(*args, option, value, "--json")
    assert proc.returncode == 2
    assert "an integer of 5000 digits; expected at most 4300" in proc.stderr
    assert "set_int_max_str_digits" not in proc.stderr + proc.stdout
    assert HUGE not in proc.stderr
    assert _json(proc)["exit_code"] == 2


def test_a_5000_digit_integer_in_json_files(tmp_path, dspark_art):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, %s]}\n' % HUGE)
    proc = run_cli("eval", str(dspark_art), "--target", TARGET, "--prompts", str(prompts),
                   "-o", str(tmp_path / "r"))
    assert_refused(proc, E.PromptSetError, ["an integer of 5000 digits"])
    ref = tmp_path / "ref.json"
    doc = json.loads(REFERENCE_TRACE.read_text())
    doc["runs"][0]["prompt"][0] = "@@"
    ref.write_text(json.dumps(doc).replace('"@@"', HUGE, 1))
    proc = run_cli("smoke", str(dspark_art), "--target", TARGET, "--prompt-ids", PROMPT,
                   "--reference", str(ref))
    assert_refused(proc, E.ReferenceTraceError, ["an integer of 5000 digits"])
    art = tmp_path / "art"
    shutil.copytree(dspark_art, art)
    text = (art / "manifest.json").read_text()
    (art / "manifest.json").write_text(text.replace('"format_version": 1',
                                                    f'"format_version": {HUGE}', 1))
    proc = run_cli("validate", str(art))
    assert proc.returncode == E.ManifestError.exit_code
    assert "an integer of 5000 digits" in proc.stderr
    assert "set_int_max_str_digits" not in proc.stderr


@pytest.mark.parametrize("command", ["validate", "inspect"])
def test_a_q4_1_matrix_in_a_q8_0_artifact_breaks_the_quantized_rule(tmp_path, q8, command):
    art = tmp_path / "art"
    shutil.copytree(q8, art)
    make_corpus.requantize_tensor("fc.weight", "Q4_1")(art)
    proc = run_cli(command, str(art), "--json")
    assert proc.returncode == E.QuantizedTensorError.exit_code, proc.stderr
    assert "'fc.weight' is Q4_1; expected Q8_0" in proc.stderr


@pytest.mark.parametrize("args", [
    ["validate", "{art}", "--bogus"],
    ["smoke", "{art}", "--target", TARGET, "--seed", "abc"],
    ["eval", "{art}", "--target", TARGET, "-o", "x", "--max-new-tokens", "1.5"],
    ["quantize", "{art}", "-o", "x"],                        # --type missing
    ["inspect", "--json"],                                   # ARTIFACT missing
], ids=["unknown-option", "bad-int", "bad-int-eval", "missing-option", "missing-argument"])
def test_a_usage_error_with_json_prints_a_json_error(dspark_art, args):
    proc = run_cli(*[a.replace("{art}", str(dspark_art)) for a in args], *(
        [] if "--json" in args else ["--json"]))
    assert proc.returncode == 2
    doc = _json(proc)
    assert doc["ok"] is False and doc["error"] == "UsageError" and doc["exit_code"] == 2
    assert doc["message"] and "Traceback" not in proc.stderr


def test_a_usage_error_without_json_prints_no_json(dspark_art):
    proc = run_cli("validate", str(dspark_art), "--bogus")
    assert proc.returncode == 2 and proc.stdout == ""
    # --json as the value of another option is not a request for JSON
    proc = run_cli("smoke", str(dspark_art), "--target", TARGET, "--prompt", "--json", "--bogus")
    assert proc.returncode == 2 and proc.stdout == ""


def test_finite_values_are_unchanged_by_the_float_rule():
    """Where z/T is finite, probs_from_logits is torch.softmax(z / T) bit for bit (the
    golden traces' arithmetic, DeepSpec's)."""
    import torch

    from dspark_convert.runtime.sampling import probs_from_logits

    g = torch.Generator().manual_seed(0)
    z = torch.randn(4, 512, generator=g) * 8
    for t in (0.25, 0.7, 1.0, 2.0, 100.0):
        got = probs_from_logits(z, t, what="test")
        want = torch.softmax(z / t, dim=-1)
        assert torch.equal(got, want)


def test_a_5000_digit_integer_in_a_gate_policy(tmp_path):
    """The twin in TOML: tomllib has no integer hook, and int()'s ValueError escaped the
    policy reader as an internal error (exit 1)."""
    policy = tmp_path / "policy.toml"
    policy.write_text(f"version = {HUGE}\n")
    proc = run_cli("gate", str(policy), "-o", str(tmp_path / "g"))
    assert_refused(proc, E.GatePolicyError, ["an integer of 5000 digits; expected at most 4300"])
    assert "set_int_max_str_digits" not in proc.stderr


def test_export_uses_the_manifest_validate_read(tmp_path, dspark_art, monkeypatch):
    """quantize's twin in `dspark export`: the tensor hashes its copy is held to are the
    ones validate read, not a manifest.json swapped in after validate (it re-read the file:
    with a tensor hash edited there, it refused a good artifact)."""
    from support.llama_cpp import write_target_gguf

    from dspark_convert.commands import export as export_module
    from dspark_convert.commands import validate as validate_module

    art = tmp_path / "art"
    shutil.copytree(dspark_art, art)
    real = validate_module.validate_artifact

    def validate_then_swap(path, **kw):
        report = real(path, **kw)
        _edit_manifest(Path(path), lambda m: m["artifact"]["tensors"][0].update(sha256="0" * 64))
        return report

    monkeypatch.setattr(validate_module, "validate_artifact", validate_then_swap)
    target = write_target_gguf(tmp_path / "target.gguf")
    result = export_module.export_llama_cpp(art, target, tmp_path / "d.gguf")
    assert result.output.is_file()


@pytest.mark.parametrize("value", [True, 1.0, "1"])
def test_a_format_version_is_the_integer_1(tmp_path, dspark_art, value):
    """The twin of calibration.json's strict types in every versioned document: true equals
    1 in Python, and a Literal[1] field took it even in strict mode (util/models.VersionOne)."""
    art = tmp_path / "art"
    shutil.copytree(dspark_art, art)
    _edit_manifest(art, lambda m: m.update(format_version=value))
    proc = run_cli("validate", str(art))
    assert proc.returncode == E.ManifestError.exit_code, proc.stderr
    assert "format_version" in proc.stderr
