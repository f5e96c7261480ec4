"""Verify-length scheduling (docs/REFERENCE.md §9, docs/SCHEDULING.md): per verify step, how
many draft tokens of each in-flight request the target verifies, chosen from the confidence
head's probabilities and the target's cost table.

- ``policies``: what a policy may see (``StepView``: confidences only), the policies as pure
  functions (full, threshold=X, dspark, dspark-async, target-only), their table and the
  parsing of a policy's name; the retrospective search without the stop, which is not
  lossless, kept only as the tests' negative control.
- ``cost_table``: the target's verify steps per second by batch tokens (a JSON file), its
  strict reader and writer, and the lookup SPS(B).
- ``profile``: that table measured on a loaded target (``dspark profile``): one verify
  forward of B tokens after a fixed context, timed, for each B.
- ``decisions``: decisions.jsonl, one verify step a line (what the policy saw, the lengths
  sent, the tokens accepted), its writer and strict reader.
- ``simulate``: the policies replayed on recorded decisions and a cost table (the recorded
  batches, or each request's blocks at a concurrency), no model.
- ``scheduler_check``: a scheduler's recorded lengths against the policy they claim, the
  first difference and why.

Pure Python and pydantic; no engine. torch only in ``profile``, imported when a profile
runs (the target is handed in loaded).
"""
