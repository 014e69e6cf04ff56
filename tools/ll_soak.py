#!/usr/bin/env python3
"""The LL soak (ep_rt/testing/soak_ll.py) from the command line, for A/B runs of whole checkouts in one device call:
    PYTHONPATH=<checkout> python tools/ll_soak.py --ranks 2 --rounds 3000 [--seed S]
    EP_RT_RANKS_PER_NODE=1 python tools/ll_soak.py --chaos ...   the put path through the chaos transport
    python tools/ll_soak.py --packed ...   the packed LL layout (EP_RT_LL_PACKED=1, Buffer sized by its hint)
Prints one JSON line per rank, then PASSED, or FAILED with every problem (rounds missing, mismatches, leaks);
exit code 0 only if every rank finished every round with no mismatch and no memory growth."""

import argparse
import json
import os
import sys

from ep_rt.runtime.choice import ll_variant
from ep_rt.testing import soak_ll
from ep_rt.testing.spawn import run_ranks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=1200.0, help="wall-clock limit of the whole run, seconds")
    ap.add_argument(
        "--chaos",
        action="store_true",
        help="the chaos variant of the LL kernels (EP_RT_CHAOS_TRANSPORT=1): remote puts delivered late, "
        "split and reordered; needs emulated nodes (EP_RT_RANKS_PER_NODE) to have remote puts",
    )
    ap.add_argument(
        "--packed",
        action="store_true",
        help="the packed LL layout (EP_RT_LL_PACKED=1; without it EP_RT_LL_PACKED=0): every rank must load the "
        "packed (or packed_chaos) cubin",
    )
    ap.add_argument(
        "--features",
        default=",".join(soak_ll.FEATURES),
        help=f"comma list of what varies: {','.join(soak_ll.FEATURES)} (default: all)",
    )
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    features = tuple(f for f in args.features.split(",") if f)
    unknown = set(features) - set(soak_ll.FEATURES)
    if unknown:
        ap.error(f"unknown features {sorted(unknown)}")
    if args.chaos and not os.environ.get("EP_RT_RANKS_PER_NODE"):
        ap.error("--chaos changes only puts to other nodes: set EP_RT_RANKS_PER_NODE (emulated nodes) too")
    env = {"EP_RT_CHAOS_TRANSPORT": "1" if args.chaos else "0", "EP_RT_LL_PACKED": "1" if args.packed else "0"}
    variant = ll_variant(args.packed, args.chaos)
    print(
        f"seed {seed}, {args.ranks} ranks, {args.rounds} rounds, features {','.join(features) or 'none'}"
        f"{', chaos transport' if args.chaos else ''}, LL cubin variant {variant}",
        flush=True,
    )
    try:
        results = run_ranks(
            soak_ll.ll_soak, args.ranks, args=(args.rounds, seed, 50, features), timeout_s=args.timeout, env=env
        )
    except Exception as e:  # a rank raised or the run timed out: that is a failed soak, with its reason
        print(f"FAILED: {type(e).__name__}: {str(e)[-3000:]}")
        return 1
    for rank, res in enumerate(results):
        print(json.dumps({"rank": rank, **res}))
    problems = soak_ll.problems(results, args.rounds, variant)
    if problems:
        print("FAILED: " + "; ".join(problems))
        return 1
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
