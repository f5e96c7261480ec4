"""golden/reference/gemma4/: DeepSeek's Gemma4 fixtures are the bytes their README records
(provenance: DeepSpec afdfa7c, copied unchanged from the shared reference data), and hold
what the README says they hold."""

from __future__ import annotations

import hashlib
import json
import re

from safetensors import safe_open

from support.gemma4 import GEMMA4, GEMMA4_DRAFTERS, GEMMA4_TARGET

ROW = re.compile(r"^\| `([^`]+)` \| `([0-9a-f]{64})` \|$", re.M)


def _recorded() -> dict[str, str]:
    return dict(ROW.findall((GEMMA4 / "README.md").read_text()))


def test_every_file_is_recorded_with_its_sha256():
    recorded = _recorded()
    present = {str(p.relative_to(GEMMA4)) for p in GEMMA4.rglob("*")
               if p.is_file() and p.suffix != ".md"}
    assert set(recorded) == present
    for name, digest in recorded.items():
        assert hashlib.sha256((GEMMA4 / name).read_bytes()).hexdigest() == digest, name


def test_readme_names_deepspec_commit():
    text = (GEMMA4 / "README.md").read_text()
    assert "afdfa7c9382a3341a3e6f17756dd816da79f132c" in text
    assert "afdfa7c9382a3341a3e6f17756dd816da79f132c" in (GEMMA4 / "DEEPSEEK_README.md").read_text()


def test_drafters_are_gemma4_dspark_and_tie_embedding_and_head():
    for name, draft in GEMMA4_DRAFTERS.items():
        cfg = json.loads((draft / "config.json").read_text())
        assert cfg["architectures"] == ["Gemma4DSparkModel"], name
        with safe_open(draft / "model.safetensors", "pt") as f:
            keys = set(f.keys())
            # DeepSpec copies the target's tied matrix into both: bit for bit equal.
            assert f.get_tensor("embed_tokens.weight").equal(f.get_tensor("lm_head.weight"))
            scalars = [f.get_tensor(f"layers.{i}.layer_scalar").item()
                       for i in range(cfg["num_hidden_layers"])]
        assert not any(k.endswith("v_proj.weight") for k in keys)   # attention_k_eq_v
        assert scalars != [1.0] * len(scalars)                      # set on purpose


def test_target_is_gemma4_unified_with_tied_head():
    cfg = json.loads((GEMMA4_TARGET / "config.json").read_text())
    assert cfg["model_type"] == "gemma4_unified"
    assert cfg["text_config"]["tie_word_embeddings"] is True
    with safe_open(GEMMA4_TARGET / "model.safetensors", "pt") as f:
        assert not any(k.endswith("lm_head.weight") for k in f.keys())
