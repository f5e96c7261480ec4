#!/usr/bin/env bash
# The long fuzz run (`make fuzz`): every property test of the suite with
# DSPARK_FUZZ_EXAMPLES examples per property (default 5000), hypothesis' statistics
# (examples run, typical time per example) and a wall-clock bound, so that a hang fails
# the run instead of stalling it. The log goes to build/fuzz/last-run.log; copy its
# summary into docs/FUZZING.md when you record a run.
set -euo pipefail
cd "$(dirname "$0")/.."

EXAMPLES="${DSPARK_FUZZ_EXAMPLES:-5000}"
LIMIT_S="${FUZZ_TIMEOUT_S:-7200}"
# Every property test of the suite (docs/FUZZING.md's table; tests/test_docs_facts.py checks
# that this list is every @given test there is): a *_fuzz.py file whole (its fixed tests
# are the seeds its properties mutate), elsewhere each property by its node id.
TARGETS=(tests/test_safetensors_reader_fuzz.py tests/test_gguf_reader_fuzz.py
         tests/test_contract_fuzz.py tests/test_float_json_fuzz.py
         tests/test_conform_fuzz.py tests/test_decisions_fuzz.py
         tests/test_gemma4_contract_fuzz.py
         tests/test_contract.py::test_config_contract_never_crashes
         tests/test_contract.py::test_any_json_document_as_config
         tests/test_engines.py::test_any_value_of_any_type_gives_reports_never_an_exception
         tests/test_gemma4_engines.py::test_any_value_of_a_gemma4_key_gives_reports
         tests/test_engine_output.py::test_the_parsers_refuse_any_bytes_with_113_or_read_them
         tests/test_speculators_config_types.py::test_any_json_in_any_field_is_a_result_or_one_line
         tests/test_cost_table.py::test_fuzz_arbitrary_bytes
         tests/test_cost_table.py::test_fuzz_documents_near_a_table
         tests/test_profile.py::test_default_tokens_is_a_cost_tables_tokens_ending_at_max
         tests/test_profile.py::test_parse_tokens_reads_back_any_increasing_list
         tests/test_profile.py::test_parse_tokens_gives_a_cost_tables_tokens_or_one_refusal
         tests/test_scheduling_policies.py::test_dspark_is_algorithm_1
         tests/test_scheduling_policies.py::test_dspark_async_admits_its_budget_by_todays_survival
         tests/test_scheduling_policies.py::test_no_shipped_policy_reads_past_the_token_it_decides
         tests/test_gate_policy.py::test_a_valid_policy_reads_back_every_value
         tests/test_gate_policy.py::test_an_unknown_key_is_refused_naming_it_and_its_entry
         tests/test_gate_policy.py::test_any_text_is_a_policy_or_one_policy_error
         tests/test_output_rules.py::test_any_spelling_of_a_path_is_refused_or_safe
         tests/test_numerics.py::test_round_to_bf16_matches_torch)
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
