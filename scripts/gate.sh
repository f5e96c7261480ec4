#!/usr/bin/env bash
# The pre-release gate: every artifact listed in release/artifacts.txt must pass
# `dspark validate --strict --json`. `make gate` runs this locally; the CI workflow
# .github/workflows/gate.yml runs the same script. For each entry it writes the JSON
# report to $GATE_OUT/reports/NAME.json (a conversion's to NAME.convert.json), prints one
# PASS/FAIL line, and exits 0 only when every entry passed (1 otherwise, 2 for a bad list).
#
#   GATE_LIST  the list (default release/artifacts.txt)
#   GATE_OUT   where artifacts and reports go (default build/gate; emptied first)
#   DSPARK     the CLI (default .venv/bin/dspark, else `dspark` on PATH)
set -uo pipefail
cd "$(dirname "$0")/.."

LIST="${GATE_LIST:-release/artifacts.txt}"
OUT="${GATE_OUT:-build/gate}"
if [[ -z "${DSPARK:-}" ]]; then
  if [[ -x .venv/bin/dspark ]]; then DSPARK=.venv/bin/dspark; else DSPARK=dspark; fi
fi
[[ -f "$LIST" ]] || { echo "gate: error: $LIST: no such list" >&2; exit 2; }

rm -rf "$OUT/artifacts" "$OUT/reports"
mkdir -p "$OUT/artifacts" "$OUT/reports"
passed=0 failed=0 line_no=0
declare -A seen=()

while IFS= read -r line || [[ -n "$line" ]]; do
  line_no=$((line_no + 1))
  line="${line%%#*}"
  read -r name kind path extra <<< "$line" || true
  [[ -z "${name:-}" ]] && continue
  if [[ -z "${path:-}" || -n "${extra:-}" || ! "$name" =~ ^[A-Za-z0-9._-]+$ || -n "${seen[$name]:-}" ]]; then
    echo "gate: error: $LIST:$line_no: expected 'NAME KIND PATH' with a new NAME of [A-Za-z0-9._-]" >&2
    exit 2
  fi
  seen[$name]=1
  case "$kind" in
    convert)
      artifact="$OUT/artifacts/$name"
      if ! "$DSPARK" convert "$path" -o "$artifact" --quiet --json \
           > "$OUT/reports/$name.convert.json" 2> "$OUT/reports/$name.stderr"; then
        echo "FAIL $name: conversion of $path: $(tail -n 1 "$OUT/reports/$name.stderr")"
        failed=$((failed + 1))
        continue
      fi ;;
    artifact) artifact="$path" ;;
    *) echo "gate: error: $LIST:$line_no: KIND is '$kind'; expected convert or artifact" >&2
       exit 2 ;;
  esac
  "$DSPARK" validate "$artifact" --strict --json > "$OUT/reports/$name.json" 2> "$OUT/reports/$name.stderr"
  code=$?
  if [[ $code -eq 0 ]]; then
    echo "PASS $name"
    passed=$((passed + 1))
    rm -f "$OUT/reports/$name.stderr"
  else
    echo "FAIL $name (exit $code): $(tail -n 1 "$OUT/reports/$name.stderr")"
    failed=$((failed + 1))
  fi
done < "$LIST"

total=$((passed + failed))
if [[ $total -eq 0 ]]; then
  echo "gate: error: $LIST lists no artifacts" >&2
  exit 2
fi
echo "gate: $passed of $total artifacts passed dspark validate --strict; reports in $OUT/reports/"
[[ $failed -eq 0 ]]
