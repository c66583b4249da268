"""Bad-input figures: hostile reports and decisions through the product's own gates.

Runs the fuzz corpus (``tests/fuzz/corpus.py``) through the exact per-record functions the job
and the controller use: ``streaming.parse.parse_record`` for load reports and
``loadbalance.decisions.decode_decision`` for decision records. Prints, per class, the cases
tried, crashes (an exception that escaped, or a dead letter whose reason is ``internal:``,
meaning our code failed and only the last-resort handler caught it), records dead-lettered or
rejected, good records accepted, and wrong verdicts (a bad record accepted or a good one
refused); then throughput and memory: the tracemalloc peak over the first ``--traced`` cases
and the growth of the process RSS over the whole run.

    .venv/bin/python benchmarks/bench_bad_input.py --reports 300000 --decisions 300000
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil

from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import weights_from_config
from loadbalance.decisions import decode_decision
from loadbalance.errors import InvalidDecision
from streaming.parse import ParseSettings, parse_record
from streaming.schema import DEAD
from tests.fuzz.corpus import Case, decision_cases, report_cases

VERDICTS = ("tried", "crashes", "dead_lettered", "accepted", "wrong")


def _report_verdict(settings: ParseSettings) -> Callable[[int, Case], str]:
    def verdict(i: int, case: Case) -> str:
        try:
            rows = parse_record(case.value, case.key, "reports", 0, i, 0, settings)
        except Exception:
            return "crashes"
        if rows[0][1] == DEAD:
            reason = json.loads(rows[0][8])["reason"]
            if not reason or reason.startswith("internal"):
                return "crashes"
            return "dead_lettered" if case.bad else "wrong"
        return "wrong" if case.bad else "accepted"

    return verdict


def _decision_verdict(max_bytes: int) -> Callable[[int, Case], str]:
    def verdict(_i: int, case: Case) -> str:
        try:
            decode_decision(case.value or b"", max_bytes=max_bytes)
        except InvalidDecision as e:
            if not e.reason:
                return "crashes"
            return "dead_lettered" if case.bad else "wrong"
        except Exception:
            return "crashes"
        return "wrong" if case.bad else "accepted"

    return verdict


def run(
    name: str, cases: Iterator[Case], verdict: Callable[[int, Case], str], traced: int
) -> dict[str, object]:
    table: dict[str, Counter[str]] = {}
    started = time.perf_counter()
    tracemalloc.start()
    numbered = enumerate(cases)
    try:
        for i, case in itertools.islice(numbered, traced):
            c = table.setdefault(case.cls, Counter())
            c["tried"] += 1
            c[verdict(i, case)] += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss0 = psutil.Process().memory_info().rss
    for i, case in numbered:
        c = table.setdefault(case.cls, Counter())
        c["tried"] += 1
        c[verdict(i, case)] += 1
    elapsed = time.perf_counter() - started
    rss_growth = psutil.Process().memory_info().rss - rss0
    total = Counter()
    for c in table.values():
        total.update(c)
    print(f"\n## {name}\n")
    print("| class | " + " | ".join(VERDICTS) + " |")
    print("| --- |" + " ---: |" * len(VERDICTS))
    for cls in sorted(table, key=lambda k: (k != "valid", k)):
        print(f"| {cls} | " + " | ".join(str(table[cls][v]) for v in VERDICTS) + " |")
    print("| **total** | " + " | ".join(f"**{total[v]}**" for v in VERDICTS) + " |")
    print(
        f"\n{total['tried']} cases in {elapsed:.1f} s ({total['tried'] / elapsed:,.0f}/s); "
        f"tracemalloc peak over the first {traced}: {peak / 2**20:.1f} MiB; "
        f"RSS growth over the rest: {rss_growth / 2**20:.1f} MiB"
    )
    return {"total": dict(total), "peak_bytes": peak, "rss_growth_bytes": rss_growth}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reports", type=int, default=300_000, help="report cases (default 300000)")
    p.add_argument("--decisions", type=int, default=300_000, help="decision cases")
    p.add_argument("--traced", type=int, default=20_000, help="cases watched by tracemalloc")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    config = LoadBalancerConfig()
    settings = ParseSettings(config.max_report_bytes, 32, weights_from_config(config))
    print(f"# bad input: seed {args.seed}, maxReportBytes {config.max_report_bytes}, "
          f"maxDecisionBytes {config.max_decision_bytes}")  # fmt: skip
    results = [
        run(
            "load reports -> streaming.parse.parse_record",
            report_cases(args.reports, args.seed, max_bytes=config.max_report_bytes),
            _report_verdict(settings),
            args.traced,
        ),
        run(
            "decisions -> loadbalance.decisions.decode_decision",
            decision_cases(args.decisions, args.seed, max_bytes=config.max_decision_bytes),
            _decision_verdict(config.max_decision_bytes),
            args.traced,
        ),
    ]
    bad = sum(r["total"].get("crashes", 0) + r["total"].get("wrong", 0) for r in results)  # type: ignore[union-attr]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
