"""A refusal never advises an option its command lacks.

`dspark inspect` of a speculators-format directory used to advise `--target`, which inspect
does not take. Here every refusal of the speculators and block-layout rules that names an
option is raised through each command that reads such input (convert, inspect, export, the
gate), and every option its line names must be one of the command that ran, or of the
command a backticked command line in it names (`dspark convert DIR --target TARGET`): the
options are read from the CLI itself (typer's app), so a renamed option fails here too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer

from support.cli import run_cli
from support.edited import edited_copy
from support.paths import GOLDEN, GOLDEN_TARGET, REFERENCE_DRAFTER
from dspark_convert import errors
from dspark_convert.cli.main import app

SPEC = GOLDEN / "speculators"
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# `dspark CMD ...`: a command line of another command, quoted in a message.
QUOTED_COMMAND = re.compile(r"`dspark ([a-z]+)[^`]*`")


def command_options() -> dict[str, set[str]]:
    """Every command of the CLI and its long options."""
    group = typer.main.get_command(app)
    return {name: {o for p in command.params for o in (*p.opts, *p.secondary_opts)
                   if o.startswith("--")}
            for name, command in group.commands.items()}


OPTIONS = command_options()


def misadvised(text: str, ran: str) -> list[str]:
    """The options ``text`` names that neither ``ran`` nor the command quoted around them
    has."""
    quoted = [(m.start(), m.end(), m.group(1)) for m in QUOTED_COMMAND.finditer(text)]
    bad = []
    for m in OPTION.finditer(text):
        owner = next((cmd for start, end, cmd in quoted if start <= m.start() < end), ran)
        if m.group() not in OPTIONS.get(owner, set()):
            bad.append(f"{m.group()} ({owner})")
    return bad


def test_the_scan_finds_an_option_the_command_lacks():
    """inspect's former advice, and an option quoted for a command that lacks it."""
    old = "a speculators-format checkpoint: convert it with --target (the target model)"
    assert misadvised(old, "inspect") == ["--target (inspect)"]
    assert misadvised(old, "convert") == []
    assert misadvised("state it with `dspark inspect --sample-from-anchor true`", "convert") \
        == ["--sample-from-anchor (inspect)"]
    assert misadvised("see `dspark convert DIR --target T`", "inspect") == []


def _copy(tmp_path: Path, base: Path, edit=None) -> Path:
    return edited_copy(base, tmp_path / "src", edit)


def _no_layout_nested_false(c):
    c["transformer_layer_config"]["sample_from_anchor"] = False


# (command, the source, an edit of its config, the arguments after it, the code expected);
# OUT is the output path, TARGET the golden target.
CASES = [
    ("convert", SPEC / "vanilla_conf_markov", None, ["-o", "OUT"], 36),
    ("convert", SPEC / "no_layout", None, ["--target", "TARGET", "-o", "OUT"], 33),
    ("convert", SPEC / "no_layout", None,
     ["--target", "TARGET", "-o", "OUT", "--sample-from-anchor", "false"], 34),
    ("convert", SPEC / "vanilla_conf_markov", None,
     ["--target", "TARGET", "-o", "OUT", "--sample-from-anchor", "false"], 38),
    ("convert", REFERENCE_DRAFTER, None,
     ["--target", "TARGET", "-o", "OUT", "--sample-from-anchor", "true"], 38),
    ("convert", SPEC / "vanilla_conf_markov", _no_layout_nested_false,
     ["--target", "TARGET", "-o", "OUT"], 34),
    ("inspect", SPEC / "vanilla_conf_markov", None, [], 36),
    ("inspect", SPEC / "no_layout", None, [], 36),
    ("inspect", SPEC / "reduced_vocab", None, [], 36),
]


@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=[f"{c[0]}-{c[1].name}-{c[4]}" for c in CASES])
def test_a_refusal_names_only_options_of_its_command(tmp_path, case):
    command, base, edit, args, code = CASES[case]
    src = _copy(tmp_path, base, edit)
    argv = [str(tmp_path / "out") if a == "OUT" else str(GOLDEN_TARGET) if a == "TARGET" else a
            for a in args]
    proc = run_cli(command, str(src), *argv)
    assert proc.returncode == code, proc.stdout + proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert misadvised(line, command) == [], line


# The gate's drafters: (the source, an edit of its config, the policy's sample_from_anchor,
# the code its convert stage records).
GATE_CASES = [
    (SPEC / "no_layout", None, None, errors.SampleFromAnchorMissingError.exit_code),
    (SPEC / "vanilla_conf_markov", _no_layout_nested_false, None,
     errors.AnchorLayoutError.exit_code),
    (SPEC / "no_layout", None, False, errors.AnchorLayoutError.exit_code),
    (SPEC / "vanilla_conf_markov", None, False, errors.SampleFromAnchorOptionError.exit_code),
    (REFERENCE_DRAFTER, None, True, errors.SampleFromAnchorOptionError.exit_code),
]


def test_the_gate_records_refusals_naming_only_options_it_can_pass_on(tmp_path):
    """The gate converts with the policy's target, so it never meets 36; what it records of
    a layout missing, stated or contradicted (33, 34, 38) names convert's option as convert's
    and the policy's key."""
    entries = ""
    for i, (base, edit, layout, _code) in enumerate(GATE_CASES):
        src = _copy(tmp_path / f"d{i}", base, edit)
        entries += (f'[[drafter]]\nname = "d{i}"\nsource = {json.dumps(str(src))}\n'
                    f'target = {json.dumps(str(GOLDEN_TARGET))}\nsha256 = "{"0" * 64}"\n'
                    + ("" if layout is None else f"sample_from_anchor = {json.dumps(layout)}\n")
                    + "\n")
    policy = tmp_path / "policy.toml"
    policy.write_text(entries)
    out = tmp_path / "gate"
    proc = run_cli("gate", str(policy), "-o", str(out))
    assert proc.returncode == errors.GateFailedError.exit_code, proc.stdout + proc.stderr
    assert misadvised(proc.stdout + proc.stderr, "gate") == []
    report = json.loads((out / "gate.json").read_text())
    codes = []
    for entry in report["entries"]:
        convert = next(s for s in entry["stages"] if s["name"] == "convert")
        codes.append(convert["exit_code"])
        assert misadvised(convert["detail"], "gate") == [], convert["detail"]
    assert codes == [code for *_, code in GATE_CASES]
