"""The gate's policy file (commands/gate_policy.py): the example policy, paths relative to
the policy file, every refusal one line naming the drafter and the key (through the real
CLI: exit 120, nothing written), a property test of the parser, and --update's textual
edit of the sha256 lines."""

from __future__ import annotations

import os
import string
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT
from support.cli import assert_refused, run_cli, temp_siblings
from dspark_convert.commands.gate_policy import (
    Defaults,
    RESERVED_NAMES,
    Drafter,
    check_updatable,
    load_policy,
    parse_policy,
    updated_path,
    with_hashes,
)
from dspark_convert.errors import GatePolicyError

GOLDEN_POLICY = ROOT / "release" / "golden.toml"
COMMIT = "a" * 40


def _write(tmp_path, text, name="policy.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _refused(tmp_path, text, *needles):
    """The policy refused by `dspark gate`: one line, exit 120, no output, no temporary."""
    path = _write(tmp_path, text)
    out = tmp_path / "out"
    line = assert_refused(run_cli("gate", str(path), "-o", str(out)), GatePolicyError,
                          [str(path), *needles])
    assert not out.exists() and temp_siblings(out) == []
    return line


MINIMAL = '[[drafter]]\nname = "a"\nsource = "src"\ntarget = "tgt"\n'


def test_the_example_policy_loads_with_its_paths_relative_to_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)              # not the repository: the paths must not care
    loaded = load_policy(GOLDEN_POLICY)
    assert [e.name for e in loaded.entries] == ["vanilla_conf_markov", "dflash_shared",
                                                "gemma4_vanilla_conf_markov"]
    for e in loaded.entries[:2]:
        assert e.source.hub is None and e.source.path.resolve().is_dir()
        assert e.target.path.resolve() == (ROOT / "golden" / "reference" / "target").resolve()
        assert e.sha256 and e.max_new_tokens == 32 and e.device == "cpu" and e.strict
    assert loaded.entries[1].require == ("strata.open",)
    assert loaded.entries[1].quantize == ("q8_0", "q4_0")
    # The Gemma4 drafter: its own target, DeepSpec's two prompts and 24 new tokens.
    gemma4 = loaded.entries[2]
    assert gemma4.target.path.resolve() == (ROOT / "golden" / "reference" / "gemma4" /
                                            "target").resolve()
    assert gemma4.prompts.resolve() == (ROOT / "golden" / "reference" / "gemma4" /
                                        "prompts.jsonl").resolve()
    assert gemma4.sha256 and gemma4.max_new_tokens == 24 and gemma4.require == ()


def test_a_hub_source_must_be_pinned_to_a_commit(tmp_path):
    loaded = load_policy(_write(tmp_path, MINIMAL.replace('"src"', f'"org/draft@{COMMIT.upper()}"')
                                .replace('"tgt"', f'"org/target@{COMMIT}"')))
    e = loaded.entries[0]
    assert (e.source.hub, e.target.hub) == (f"org/draft@{COMMIT}", f"org/target@{COMMIT}")
    _refused(tmp_path, MINIMAL.replace('"src"', '"org/draft@main"'),
             "drafter[0] 'a': key 'source'", "is not pinned", "40-hex commit")
    _refused(tmp_path, MINIMAL.replace('"tgt"', '"org/target@v1.0"'),
             "drafter[0] 'a': key 'target'", "is not pinned")


@pytest.mark.parametrize("text, needles", [
    ('[[drafter]\nname = "a"\n', ["not TOML:", "line 1"]),
    (MINIMAL + 'min_tua = 2.0\n', ["drafter[0] 'a': key 'min_tua': unknown key", "min_tau"]),
    ('[defaults]\nmax_new_token = 8\n' + MINIMAL, ["[defaults]: key 'max_new_token': unknown key"]),
    ('release = 1\n' + MINIMAL, ["key 'release': unknown key"]),
    (MINIMAL + 'min_tau = "2"\n', ["drafter[0] 'a': key 'min_tau': expected a number", "'2' (str)"]),
    (MINIMAL + 'require = ["strata.ope"]\n', ["key 'require[0]'", "'strata.open'"]),
    (MINIMAL + 'quantize = ["q8_0", "q8_0"]\n', ["key 'quantize'", "listed twice"]),
    (MINIMAL + 'max_acceptance_drop = 1.5\n', ["key 'max_acceptance_drop'"]),
    (MINIMAL + 'min_tau = nan\n', ["key 'min_tau'"]),
    (MINIMAL + 'min_tau = 0.5\n', ["key 'min_tau'", "greater than or equal to 1"]),
    (MINIMAL + 'sha256 = "abc"\n', ["key 'sha256'"]),
    (MINIMAL + 'changed_because = "new converter"\n', ["key 'changed_because'", "'sha256'"]),
    (MINIMAL + 'lock = "x.lock"\n', ["key 'lock'", "Hub source"]),
    (MINIMAL + MINIMAL, ["drafter[1] 'a': key 'name'", "drafter[0] too"]),
    ('[[drafter]]\nname = "a"\nsource = "src"\n', ["drafter[0] 'a': key 'target' is missing"]),
    ('[[drafter]]\nname = "a/b"\nsource = "s"\ntarget = "t"\n', ["drafter[0] 'a/b': key 'name'"]),
    ('[drafter]\nname = "a"\n', ["key 'drafter': expected a list", "[[drafter]]"]),
    ('[defaults]\nmax_new_tokens = 8\n', ["key 'drafter' is missing"]),
    ('[defaults]\ndevice = "gpu"\n' + MINIMAL, ["[defaults]: key 'device'", "'cuda'"]),
], ids=["toml", "unknown-key", "unknown-default", "unknown-root", "type", "engine", "twice",
        "range", "nan", "tau-below-1", "sha256", "reason-alone", "local-lock", "duplicate", "missing",
        "name", "table", "no-drafter", "device"])
def test_each_policy_error_is_one_line_naming_the_entry_and_the_key(tmp_path, text, needles):
    _refused(tmp_path, text, *needles)


def test_a_missing_or_non_utf8_policy_is_refused(tmp_path):
    out = tmp_path / "out"
    assert_refused(run_cli("gate", str(tmp_path / "nope.toml"), "-o", str(out)), GatePolicyError,
                   ["nope.toml: not found"])
    os.mkfifo(tmp_path / "fifo.toml")            # named as a FIFO, never waited on
    assert_refused(run_cli("gate", str(tmp_path / "fifo.toml"), "-o", str(out)), GatePolicyError,
                   ["is a FIFO", "expected a TOML file"])
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'[[drafter]]\nname = "\xff"\n')
    assert_refused(run_cli("gate", str(bad), "-o", str(out)), GatePolicyError, ["not UTF-8"])
    assert not out.exists()


# --- the parser, as a property -----------------------------------------------------------

# valid names: not the gate's own files (RESERVED_NAMES, in any case)
_names = st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=12).filter(
    lambda s: s[0].isalnum() and s.casefold() not in RESERVED_NAMES)
_keys = st.text(string.ascii_lowercase + "_", min_size=1, max_size=12)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


def _render(defaults: dict, drafters: list[dict]) -> str:
    out = []
    if defaults:
        out += ["[defaults]"] + [f"{k} = {_toml_value(v)}" for k, v in defaults.items()] + [""]
    for d in drafters:
        out += ["[[drafter]]"] + [f"{k} = {_toml_value(v)}" for k, v in d.items()] + [""]
    return "\n".join(out)


_drafter = st.fixed_dictionaries(
    {"name": _names, "source": st.sampled_from(["src", f"org/d@{COMMIT}"]),
     "target": st.sampled_from(["tgt", f"org/t@{COMMIT}"])},
    optional={"sha256": st.sampled_from(["0" * 64, "f" * 64]),
              "require": st.lists(st.sampled_from(["strata.open", "strata.run", "llama.cpp"]),
                                  unique=True),
              "quantize": st.lists(st.sampled_from(["q8_0", "q5_0", "q4_0"]), unique=True),
              "min_tau": st.floats(1, 10), "max_tau_drop": st.floats(0, 1),
              "max_acceptance_drop": st.floats(0, 1), "max_new_tokens": st.integers(1, 512)})
_defaults = st.fixed_dictionaries({}, optional={
    "max_new_tokens": st.integers(1, 512), "device": st.sampled_from(["auto", "cpu", "cuda"]),
    "dtype": st.sampled_from(["float32", "bfloat16"]), "strict": st.booleans()})


@settings(max_examples=150, deadline=None)
@given(_defaults, st.lists(_drafter, min_size=1, max_size=4,
                           unique_by=lambda d: d["name"].casefold()))   # one directory each
def test_a_valid_policy_reads_back_every_value(defaults, drafters):
    policy = parse_policy(_render(defaults, drafters), "p.toml")
    assert policy.defaults == Defaults(**defaults)
    assert list(policy.drafter) == [Drafter(**d) for d in drafters]


@settings(max_examples=150, deadline=None)
@given(st.lists(_drafter, min_size=1, max_size=3, unique_by=lambda d: d["name"].casefold()),
       st.data())
def test_an_unknown_key_is_refused_naming_it_and_its_entry(drafters, data):
    i = data.draw(st.integers(0, len(drafters) - 1))
    key = data.draw(_keys.filter(lambda k: k not in Drafter.model_fields))
    drafters[i] = {**drafters[i], key: data.draw(st.sampled_from([1, "x", True, [1]]))}
    with pytest.raises(GatePolicyError) as caught:
        parse_policy(_render({}, drafters), "p.toml")
    assert f"drafter[{i}] {drafters[i]['name']!r}: key {key!r}: unknown key" in caught.value.message


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_a_policy_or_one_policy_error(text):
    try:
        parse_policy(text, "p.toml")
    except GatePolicyError as exc:
        assert "\n" not in exc.message and exc.message.startswith("p.toml: ")


# --- --update ------------------------------------------------------------------------------

def test_update_rewrites_each_sha256_line_and_adds_the_missing_one():
    text = GOLDEN_POLICY.read_text()
    # drop the second drafter's sha256 line: it is then added after its name
    lines = text.splitlines(keepends=True)
    second = [i for i, l in enumerate(lines) if l.startswith("sha256 = ")][1]
    text = "".join(lines[:second] + lines[second + 1:])
    new = with_hashes(text, {0: "1" * 64, 1: "2" * 64, 2: "3" * 64}, "golden.toml")
    policy = tomllib.loads(new)
    assert [d["sha256"] for d in policy["drafter"]] == ["1" * 64, "2" * 64, "3" * 64]
    # every comment and every other line kept, in order
    kept = [l for l in new.splitlines() if not l.startswith("sha256 = ")]
    assert kept == [l for l in text.splitlines() if not l.startswith("sha256 = ")]
    assert new.splitlines()[new.splitlines().index('name = "dflash_shared"') + 1] == \
        f'sha256 = "{"2" * 64}"'
    # only the entries measured are changed
    assert tomllib.loads(with_hashes(text, {1: "3" * 64}, "g"))["drafter"][0]["sha256"] == \
        tomllib.loads(text)["drafter"][0]["sha256"]


def test_update_keeps_a_trailing_comment_and_refuses_a_layout_it_cannot_edit():
    text = MINIMAL + 'sha256 = "' + "0" * 64 + '"   # the 1.0 release\n'
    assert with_hashes(text, {0: "9" * 64}, "p").endswith(f'sha256 = "{"9" * 64}"   # the 1.0 release\n')
    inline = 'drafter = [{name = "a", source = "s", target = "t"}]\n'
    with pytest.raises(GatePolicyError, match="cannot write the measured hashes"):
        with_hashes(inline, {0: "9" * 64}, "p")
    assert updated_path(GOLDEN_POLICY).name == "golden.updated.toml"


def test_update_keeps_crlf_line_endings_and_splits_lines_only_where_toml_does():
    text = (MINIMAL.replace("\n", "\r\n")
            + 'changed_because = "a\u2028[[drafter]] inside a string"\r\n')
    text = text.replace("changed_because", 'sha256 = "' + "0" * 64 + '"\r\nchanged_because')
    new = with_hashes(text.replace('sha256 = "' + "0" * 64 + '"\r\n', ""), {0: "9" * 64}, "p")
    assert new.count("\n") == new.count("\r\n") == text.count("\r\n")
    assert f'name = "a"\r\nsha256 = "{"9" * 64}"\r\n' in new
    # a last line without its line ending gets the file's before the line added after it
    last = with_hashes('[[drafter]]\r\nsource = "s"\r\ntarget = "t"\r\nname = "a"', {0: "9" * 64}, "p")
    assert last.endswith(f'name = "a"\r\nsha256 = "{"9" * 64}"\r\n')


def test_update_is_checked_on_the_policy_before_anything_runs(tmp_path):
    check_updatable(load_policy(_write(tmp_path, MINIMAL)))           # editable: no refusal
    inline = _write(tmp_path, 'drafter = [{name = "a", source = "s", target = "t"}]\n', "i.toml")
    with pytest.raises(GatePolicyError, match="cannot write the measured hashes"):
        check_updatable(load_policy(inline))


@pytest.mark.parametrize("text", [
    MINIMAL + 'changed_because = "' + "[" * 40 + '"\nsha256 = "' + "0" * 64 + '"\n',
    MINIMAL + "# " + "{" * 40 + "\n",
    MINIMAL + 'changed_because = """' + "[" * 40 + '\n' + "a.b." * 40 + '"""\nsha256 = "' + "0" * 64 + '"\n',
    MINIMAL + "changed_because = '''" + "[" * 40 + "'''\nsha256 = \"" + "0" * 64 + '"\n',
    MINIMAL + 'prompts = "a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.jsonl"\n',
])
def test_brackets_and_dots_in_strings_and_comments_are_not_nesting(text):
    assert parse_policy(text, "p").drafter[0].name == "a"


def test_nesting_at_the_bound_is_read_and_one_more_is_refused():
    from dspark_convert.commands.gate_policy import MAX_NESTING

    def text(depth):        # an unknown key (refused by name) nested ``depth`` deep
        return "x = " + "[" * depth + "]" * depth + "\n" + MINIMAL

    with pytest.raises(GatePolicyError, match="key 'x': unknown key"):
        parse_policy(text(MAX_NESTING), "p")
    with pytest.raises(GatePolicyError, match=f"nested {MAX_NESTING + 1} deep"):
        parse_policy(text(MAX_NESTING + 1), "p")
