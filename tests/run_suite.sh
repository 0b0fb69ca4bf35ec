#!/usr/bin/env bash
# `make test`: the suite in two halves side by side, each first on SQLite, then on PostgreSQL for
# those of its tests that use a database (tests/conftest.py says how). One pytest alone kept a 2-core
# machine busy about 40% of the time (much of the suite waits on child processes and services): on
# the 2-core VM the four passes took 534 s side by side, against about 900 s one after another.
# Half `a` is the cluster, fuzz and web tests (most of the PostgreSQL pass), half `b` the rest (a
# new folder of tests lands there). Both print as they go, each line marked with its half; the
# exit code is 0 only when all four passes passed.
#
#   tests/run_suite.sh [pytest options...]     e.g. -x, -k name
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
HALF_A=(tests/e2e tests/faults tests/fuzz tests/web)

half() {  # name, then the pytest arguments that choose its tests
    local name=$1 cache=.pytest_cache/$1
    shift
    mkdir -p "$cache"
    "$PYTEST" -q --durations=15 -o cache_dir="$cache" --db-tests-out="$cache/db-tests.txt" "$@" "${EXTRA[@]}" &&
        KERNELSWARM_TEST_DATABASE=postgresql "$PYTEST" -q -x --durations=10 -o cache_dir="$cache" \
            --db-tests-only="$cache/db-tests.txt" "${EXTRA[@]}"
}

EXTRA=("$@")
ignores=()
for folder in "${HALF_A[@]}"; do ignores+=("--ignore=$folder"); done
started=$(date +%s)
half a "${HALF_A[@]}" > >(sed -u 's/^/[a] /') 2>&1 &
a=$!
half b tests "${ignores[@]}" > >(sed -u 's/^/[b] /') 2>&1 &
b=$!
wait "$a"
exit_a=$?
wait "$b"
exit_b=$?
sleep 0.2  # the last lines of the prefixing processes
echo "suite: half a exit $exit_a, half b exit $exit_b, $(($(date +%s) - started)) s"
[ "$exit_a" -eq 0 ] && [ "$exit_b" -eq 0 ]
