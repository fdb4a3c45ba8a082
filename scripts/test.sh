#!/usr/bin/env bash
# The project's test command: the checks, the fast tests, then the end-to-end test with QEMU guests.
#   scripts/test.sh
# 0. cargo fmt --all -- --check, then cargo clippy --workspace --all-targets -- -D warnings
#    (the workspace's lints, Cargo.toml [workspace.lints], as errors)
# 1. cargo test --workspace            (no QEMU, no root needed; bounded, VRNIC_CARGO_TEST_TIMEOUT=900)
#    then cargo doc --workspace --no-deps with warnings as errors (broken or private doc links),
#    then tests/deb/check.sh            (vrnic's Debian package: built, listed, extracted, checked)
# 2. tests/e2e/run.sh                  (root: network namespace, QEMU; see that file)
#    with the rxe-rxe baseline first (E2E_BASELINE=0 leaves it out); VRNIC_E2E=0 skips step 2.
#    Its default steps include soak-2min: scripts/soak.sh --minutes 2 (the 30-minute soak is
#    scripts/soak.sh --minutes 30, run by hand), and heavy: tests/e2e/heavy.sh, perftest with many
#    QPs and large messages between host processes on release daemons (it builds the release
#    daemon: cargo build --release -p vrnic-vhost).
# Installs the Debian packages it needs, and clippy and rustfmt (scripts/deps.sh).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
t0=$SECONDS
"$top/scripts/deps.sh"
if [ "${VRNIC_E2E:-1}" != 0 ]; then
    # Which QEMU the end-to-end test will use, and why, before anything else (VRNIC_QEMU overrides).
    "$top/scripts/qemu-root.sh" >/dev/null
fi
echo "=== cargo fmt --all -- --check"
cargo fmt --all -- --check
echo "=== cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings 2>&1
echo "=== cargo test --workspace"
# Bounded: a hung test must not eat CI's whole budget (VRNIC_CARGO_TEST_TIMEOUT seconds).
timeout -k 30 "${VRNIC_CARGO_TEST_TIMEOUT:-900}" cargo test --workspace 2>&1 || {
    rc=$?
    [ $rc = 124 ] && echo "cargo test: timed out after ${VRNIC_CARGO_TEST_TIMEOUT:-900} s"
    exit $rc
}
echo "=== cargo doc --workspace --no-deps (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet 2>&1
echo "=== Debian package: tests/deb/check.sh"
"$top/tests/deb/check.sh"
if [ "${VRNIC_E2E:-1}" = 0 ]; then
    echo "=== e2e skipped (VRNIC_E2E=0)"
    exit 0
fi
echo "=== cargo test and package check took $((SECONDS - t0)) s; end-to-end test next"
E2E_BASELINE=${E2E_BASELINE:-1} exec "$top/tests/e2e/run.sh" "$@"
