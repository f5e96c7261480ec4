"""Regenerate the synthetic golden fixtures and the expected artifact hashes.

    python golden/make_fixtures.py           # rewrite golden/synthetic/ and golden/expected.json
    python golden/make_fixtures.py --check   # regenerate into a temporary dir and compare

Each fixture is a small DSpark checkpoint written by ``dspark_convert.synthetic`` with a
fixed seed (numpy PCG64 values, rounded to BF16 by torch, saved by the safetensors
library), so the same code gives the same bytes. ``expected.json`` records, for every
fixture and for the DeepSpec-made reference drafter, the SHA-256 of the ``drafter.gguf``
and ``manifest.json`` that ``dspark convert`` writes. They change only when the format or
the converter version changes; then rerun this script and say why in the commit.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dspark_convert.commands.convert import convert  # noqa: E402
from dspark_convert.synthetic import make_synthetic_checkpoint  # noqa: E402

REFERENCE_DRAFTER = "reference/vanilla_conf_markov/draft"

# name -> arguments of make_synthetic_checkpoint; one fixture per head variant DeepSpec
# has, plus the two source layouts (sharded, F32) the converter must handle.
FIXTURES: dict[str, dict] = {
    "dflash_plain": dict(seed=1, markov_rank=0, enable_confidence_head=False,
                         include_embeddings=False),
    "gated_conf_markov": dict(seed=2, markov_head_type="gated", confidence_head_with_markov=True),
    "rnn_conf_plain": dict(seed=3, markov_head_type="rnn", confidence_head_with_markov=False),
    "vanilla_sharded": dict(seed=4, markov_head_type="vanilla", shards=3),
    "vanilla_f32": dict(seed=5, markov_head_type="vanilla", enable_confidence_head=False,
                        confidence_head_with_markov=None, dtype="F32"),
}


def build(root: Path) -> dict[str, dict[str, str]]:
    """Write every fixture under root/synthetic and return the expected hashes."""
    from dspark_convert.util.hashing import sha256_file

    synthetic = root / "synthetic"
    expected = {}
    sources = {name: synthetic / name for name in FIXTURES}
    for name, args in FIXTURES.items():
        make_synthetic_checkpoint(sources[name], **args)
    sources["reference"] = HERE / REFERENCE_DRAFTER
    with tempfile.TemporaryDirectory() as tmp:
        for name, source in sources.items():
            out = Path(tmp) / name
            convert(source, out)
            expected[name] = {
                "source": str(source.relative_to(root if name != "reference" else HERE)),
                "drafter.gguf": sha256_file(out / "drafter.gguf"),
                "manifest.json": sha256_file(out / "manifest.json"),
            }
    return expected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temporary directory and compare with golden/")
    args = parser.parse_args()
    if not args.check:
        shutil.rmtree(HERE / "synthetic", ignore_errors=True)
        expected = build(HERE)
        (HERE / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
        print(f"wrote {len(FIXTURES)} fixtures and golden/expected.json")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        expected = build(Path(tmp))
        recorded = json.loads((HERE / "expected.json").read_text())
        problems = [f"expected.json differs for {k}" for k in expected if expected[k] != recorded.get(k)]
        for name in FIXTURES:
            cmp = filecmp.dircmp(Path(tmp) / "synthetic" / name, HERE / "synthetic" / name)
            names = cmp.left_list
            _match, mismatch, errors = filecmp.cmpfiles(cmp.left, cmp.right, names, shallow=False)
            if mismatch or errors or cmp.left_only or cmp.right_only:
                problems.append(f"fixture {name} differs: {mismatch + errors + cmp.left_only + cmp.right_only}")
    for line in problems:
        print(line)
    print("golden fixtures are current" if not problems else "golden fixtures are stale")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
