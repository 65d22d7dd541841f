"""One member of ``test_fencing``'s three-process job; prints its findings as one JSON line.

Generation 0 is {0, 1, 2}. Member 2 stands still (as a frozen process or one behind a network
partition would) while 0 and 1 start an exact ring sum and an all-reduce, give generation 0 up
after half a second, close its group and go on as generation 1 = {0, 1}, summing while member 2
comes back and does its part of generation 0.

Usage: python fence_member.py RANK PORT
"""

import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from dyntrain.elastic.collective.comm import Aborted, CollectiveFailed, Group

N = 1 << 16  # elements per sum: several socket buffers, so a late sender has much to deliver
ROUNDS = 20  # generation 1 sums while the late member delivers
WAIT = timedelta(seconds=120)


def group(store: dist.Store, generation: int, rank: int, size: int) -> Group:
    pg = dist.ProcessGroupGloo(dist.PrefixStore(f"pg/{generation}/", store), rank, size, WAIT)
    return Group(pg, rank, size, torch.device("cpu"), ring=True)


def outcome(g: Group, work, within: float = 60.0) -> str:
    deadline = time.monotonic() + within
    try:
        g.wait(work, lambda: time.monotonic() > deadline)
        return "completed"
    except CollectiveFailed:
        return "failed"
    except Aborted:
        return "pending"


def main() -> None:
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 3, False, timeout=WAIT)
    g0 = group(store, 0, rank, 3)
    contrib = g0.buffers["contrib"] = torch.full((N,), float(rank + 1))
    out = g0.buffers["out"] = torch.zeros(N)
    meta = g0.buffers["meta"] = torch.full((N,), float(rank + 1))
    if rank == 2:  # stands still until the others went on without it, then does its part
        store.wait(["moved-on"], WAIT)
        found = {"ring": outcome(g0, g0.exact_sum_async(contrib, out)),
                 "allreduce": outcome(g0, g0.allreduce_async(meta))}
        store.set("late-done", "1")
        g0.close()
        print(json.dumps(found), flush=True)
        return
    ring, plain = g0.exact_sum_async(contrib, out), g0.allreduce_async(meta)
    given_up = time.monotonic() + 0.5  # when the coordinator's abort would come
    try:
        g0.wait(ring, lambda: time.monotonic() > given_up)
        raise AssertionError("generation 0 completed without member 2")
    except Aborted:
        pass
    g0.close(abandoned=True)
    abandoned = outcome(g0, plain, within=5.0)  # the all-reduce that was still pending
    left = {"out": (out, out.clone()), "meta": (meta, meta.clone())}
    g1 = group(store, 1, rank, 2)
    if store.add("survivors", 1) == 2:
        store.set("moved-on", "1")
    exact = []
    for i in range(ROUNDS):
        c = g1.buffers["contrib"] = torch.full((N,), float(rank + 10 * i))
        o = g1.buffers["out"] = torch.zeros(N)
        g1.wait(g1.exact_sum_async(c, o), lambda: False)
        exact.append(bool((o == float(1 + 20 * i)).all()))
    store.wait(["late-done"], WAIT)
    g1.close(abandoned=False)
    untouched = [name for name, (now, then) in left.items() if torch.equal(now, then)]
    print(json.dumps({"exact": exact, "untouched": untouched, "abandoned": abandoned}),
          flush=True)


if __name__ == "__main__":
    main()
