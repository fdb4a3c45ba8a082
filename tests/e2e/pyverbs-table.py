#!/usr/bin/python3
"""rdma-core's pyverbs suite on vrnic beside rxe (issue 30, point 4): one table, module by module.

Usage: pyverbs-table.py VRNIC_LOG RXE_LOG [OUT_PREFIX]

Each LOG is one `run_tests.py --dev DEV --gid N -v` run's output (unittest's verbose lines,
`test_x (tests.test_mod.Class.test_x) ... ok`, the docstring's first line sometimes between the
name and ` ... `), ended by a line `VRNIC-PYVERBS-END NAME rc=RC secs=S` (tests/e2e/guest-sw.sh).
Prints the table (per module, for each side: tests seen, passed, skipped, failed + errors), then
the verdict lines the e2e harness counts:
  PASS/FAIL: pyverbs vrnic guest: the suite ran to its end (unittest's summary, no timeout, no abort)
  PASS/FAIL: pyverbs vrnic guest beside rxe guest: no test passes on rxe and fails on vrnic
and, as notes, the tests rxe passes that vrnic skips (with the suite's reason: a capability vrnic
lacks) and the tests that fail on both. With OUT_PREFIX, writes OUT_PREFIX.txt (the table) and
OUT_PREFIX.csv (test, module, rxe status, vrnic status). Exit status 0 iff no FAIL line.
"""

import collections
import re
import sys

TEST = re.compile(r"^(test_\w+) \(tests\.(\w+)\.(\w+)\.\w+\)")
# The status after " ... " (unittest's TextTestResult, verbosity 2).
STATUS = re.compile(r" \.\.\. (ok|FAIL|ERROR|skipped (.*)|expected failure|unexpected success)\s*$")
# The status alone on a line: the test printed something after " ... ".
BARE = re.compile(r"^(ok|FAIL|ERROR|skipped (.*)|expected failure|unexpected success)\s*$")
END = re.compile(r"VRNIC-PYVERBS-END \S+ rc=(\S+) secs=(\S+)")
SUMMARY = re.compile(r"^Ran (\d+) tests? in ")


def parse(path):
    """Returns ({test id: (module, status, reason)}, rc, secs, ran) of one log."""
    tests = {}
    current = None
    rc = secs = ran = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\r\n").replace("\r", "")
            m = END.search(line)
            if m:
                rc, secs = m.group(1), m.group(2)
                continue
            m = SUMMARY.match(line)
            if m:
                ran = int(m.group(1))
                continue
            m = TEST.match(line)
            if m:
                current = (f"{m.group(2)}.{m.group(3)}.{m.group(1)}", m.group(2))
            m = STATUS.search(line) or (BARE.match(line) if current else None)
            if m and current:
                word = m.group(1)
                if word.startswith("skipped"):
                    status, reason = "skipped", (m.group(2) or "").strip("'\"")
                elif word == "ok" or word == "expected failure":
                    status, reason = "passed", ""
                else:
                    status, reason = "failed", word
                tests[current[0]] = (current[1], status, reason)
                current = None
    return tests, rc, secs, ran


def counts(tests):
    per = collections.defaultdict(collections.Counter)
    for module, status, _ in tests.values():
        per[module]["seen"] += 1
        per[module][status] += 1
    return per


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    vr, vr_rc, vr_secs, vr_ran = parse(sys.argv[1])
    rx, rx_rc, rx_secs, rx_ran = parse(sys.argv[2])
    prefix = sys.argv[3] if len(sys.argv) == 4 else None
    pv, pr = counts(vr), counts(rx)
    lines = []
    head = f"{'module':24} | {'rxe: ran':>8} {'pass':>5} {'skip':>5} {'fail':>5} | {'vrnic: ran':>10} {'pass':>5} {'skip':>5} {'fail':>5}"
    lines.append(head)
    lines.append("-" * len(head))
    total_r, total_v = collections.Counter(), collections.Counter()
    for module in sorted(set(pv) | set(pr)):
        r, v = pr[module], pv[module]
        total_r.update(r)
        total_v.update(v)
        lines.append(
            f"{module:24} | {r['seen']:8} {r['passed']:5} {r['skipped']:5} {r['failed']:5} | "
            f"{v['seen']:10} {v['passed']:5} {v['skipped']:5} {v['failed']:5}"
        )
    lines.append("-" * len(head))
    lines.append(
        f"{'total':24} | {total_r['seen']:8} {total_r['passed']:5} {total_r['skipped']:5} {total_r['failed']:5} | "
        f"{total_v['seen']:10} {total_v['passed']:5} {total_v['skipped']:5} {total_v['failed']:5}"
    )
    lines.append(f"rxe guest: rc={rx_rc} in {rx_secs} s; vrnic guest: rc={vr_rc} in {vr_secs} s")
    print("\n".join(lines))
    if prefix:
        with open(prefix + ".txt", "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(prefix + ".csv", "w") as f:
            f.write("test,module,rxe,vrnic,vrnic_reason\n")
            for t in sorted(set(vr) | set(rx)):
                m = (vr.get(t) or rx.get(t))[0]
                f.write(f"{t},{m},{rx.get(t, ('', 'absent', ''))[1]},{vr.get(t, ('', 'absent', ''))[1]},"
                        f"\"{vr.get(t, ('', '', ''))[2]}\"\n")

    failed = False
    # The suite on vrnic ran to its end: unittest's summary printed, every test it counted seen.
    if vr_rc in ("0", "1") and vr_ran is not None and vr_ran == len(vr) and vr_ran > 0:
        print(f"PASS: pyverbs vrnic guest: the suite ran to its end ({vr_ran} tests, rc {vr_rc}, {vr_secs} s)")
    else:
        failed = True
        print(f"FAIL: pyverbs vrnic guest: the suite did not run to its end (rc {vr_rc}, "
              f"unittest counted {vr_ran}, {len(vr)} results seen)")
    if rx_ran is None or rx_ran == 0:
        failed = True
        print(f"FAIL: pyverbs rxe guest: the suite did not run (rc {rx_rc}); nothing to compare with")
    worse = sorted(t for t, (_, s, _) in vr.items() if s == "failed" and rx.get(t, ("", ""))[1] != "failed")
    missing = sorted(t for t, (_, s, _) in rx.items() if s == "passed" and t not in vr)
    if worse or missing:
        failed = True
        for t in worse:
            print(f"FAIL: pyverbs {t}: fails on vrnic ({vr[t][2]}), {rx.get(t, ('', 'absent'))[1]} on rxe")
        for t in missing:
            print(f"FAIL: pyverbs {t}: passes on rxe, never ran on vrnic")
    elif rx_ran:
        print(f"PASS: pyverbs vrnic guest beside rxe guest: no test passes on rxe and fails on vrnic "
              f"(vrnic {total_v['passed']} passed, rxe {total_r['passed']})")
    both = sorted(t for t, (_, s, _) in vr.items() if s == "failed" and rx.get(t, ("", ""))[1] == "failed")
    for t in both:
        print(f"note: {t} fails on both ({vr[t][2]})")
    lacks = collections.Counter(vr[t][2] for t, (_, s, _) in rx.items() if s == "passed" and vr.get(t, ("", ""))[1] == "skipped")
    for reason, n in lacks.most_common():
        print(f"note: {n} test(s) rxe passes skip on vrnic: {reason}")
    better = sum(1 for t, (_, s, _) in vr.items() if s == "passed" and rx.get(t, ("", ""))[1] != "passed")
    if better:
        print(f"note: {better} test(s) pass on vrnic and not on rxe")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
