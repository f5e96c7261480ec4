"""The ranges of the run options `dspark eval` takes and the gate's policy passes on to it
(--device, --dtype, --max-new-tokens): one place for both, light enough (no numpy, no
torch) for the policy reader, which checks them before anything runs."""

from __future__ import annotations

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "bfloat16")      # runtime/loading.py COMPUTE_DTYPES, named here so that
                                      # options are checked before torch is imported
MAX_NEW_TOKENS_LIMIT = 1 << 20
