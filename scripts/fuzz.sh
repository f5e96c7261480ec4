#!/usr/bin/env bash
# The long fuzz run (`make fuzz`): every property-based fuzz target with
# DSPARK_FUZZ_EXAMPLES examples per property (default 5000), hypothesis' statistics
# (examples run, typical time per example) and a wall-clock bound, so that a hang fails
# the run instead of stalling it. The log goes to build/fuzz/last-run.log; copy its
# summary into docs/FUZZING.md when you record a run.
set -euo pipefail
cd "$(dirname "$0")/.."

EXAMPLES="${DSPARK_FUZZ_EXAMPLES:-5000}"
LIMIT_S="${FUZZ_TIMEOUT_S:-7200}"
TARGETS=(tests/test_safetensors_reader_fuzz.py tests/test_gguf_reader_fuzz.py
         tests/test_contract.py tests/test_contract_fuzz.py tests/test_float_json_fuzz.py)
LOG=build/fuzz/last-run.log
mkdir -p build/fuzz

{
  echo "# dspark fuzz run: $(date -u +%Y-%m-%dT%H:%M:%SZ), DSPARK_FUZZ_EXAMPLES=$EXAMPLES"
  echo "# machine: $(uname -srm), $(nproc) cores, python $(.venv/bin/python -c 'import platform; print(platform.python_version())')"
} > "$LOG"
start=$(date +%s)
status=0
DSPARK_FUZZ_EXAMPLES="$EXAMPLES" timeout "$LIMIT_S" .venv/bin/python -m pytest -q \
  -p no:cacheprovider --hypothesis-show-statistics "${TARGETS[@]}" >> "$LOG" 2>&1 || status=$?
echo "# exit status $status after $(( $(date +%s) - start )) s (124: the ${LIMIT_S} s bound)" >> "$LOG"
tail -n 3 "$LOG"
exit "$status"
