"""The exact ring's hops with fresh buffers (as before ``ring.Scratch``) beside its reused hop
buffers, and beside gloo's own float32 all-reduce, in one run.

``--world`` processes (one torch thread each, gloo on loopback) sum ``--buckets`` buckets of
``--numel`` float32 elements, one after another as the ring thread does: with
``exact_ring_sum`` and fresh tensors per hop, with ``exact_ring_sum`` and one ``Scratch``, and
with ``ProcessGroupGloo.allreduce``. The three take turns within each round (the order flips
every round); the table gives rank 0's median time per round over all buckets, and the
ratios. Every member checks that both exact variants give the same bits.

    .venv/bin/python bench/ring_hops.py                        # ~1 minute
    .venv/bin/python bench/ring_hops.py --world 2 --rounds 9

Writes ``bench/results/ring_hops.json``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from _common import free_port, machine_info, median, write_result
from dyntrain.elastic.collective.ring import Scratch, exact_ring_sum

KINDS = ("fresh buffers", "reused buffers", "gloo float32 all-reduce")


def _member(rank: int, world: int, port: int, args, queue) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    pg = dist.ProcessGroupGloo(store, rank, world)
    g = torch.Generator().manual_seed(rank)
    contribs = [torch.randn(args.numel, generator=g) for _ in range(args.buckets)]
    outs = {k: [torch.empty(args.numel) for _ in range(args.buckets)] for k in KINDS}
    scratch = Scratch()
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in range(args.rounds):
        for kind in KINDS if r % 2 == 0 else tuple(reversed(KINDS)):
            pg.barrier().wait()
            began = time.perf_counter()
            for c, o in zip(contribs, outs[kind], strict=True):
                if kind == KINDS[2]:
                    o.copy_(c)
                    pg.allreduce([o]).wait()
                else:
                    exact_ring_sum(pg, rank, world, c, o,
                                   scratch=scratch if kind == KINDS[1] else None)
            pg.barrier().wait()
            times[kind].append(time.perf_counter() - began)
    same = all(torch.equal(a, b) for a, b in zip(outs[KINDS[0]], outs[KINDS[1]], strict=True))
    queue.put((rank, times, same))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--buckets", type=int, default=25, help="buckets summed per round")
    ap.add_argument("--numel", type=int, default=1 << 20, help="float32 elements per bucket")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "ring_hops.json"))
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    began = time.time()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_member, args=(r, args.world, port, args, queue))
             for r in range(args.world)]
    for proc in procs:
        proc.start()
    results = sorted(queue.get(timeout=1800) for _ in procs)
    for proc in procs:
        proc.join()
    times = results[0][1]
    med = {k: median(v) for k, v in times.items()}
    print(f"world {args.world}, {args.buckets} buckets of {args.numel} float32 elements "
          f"({args.buckets * args.numel * 4 / 1e6:.0f} MB) per round, {args.rounds} rounds")
    print("| summed with | median s per round | vs fresh buffers | vs gloo all-reduce |")
    print("| --- | ---: | ---: | ---: |")
    for k in KINDS:
        print(f"| {k} | {med[k]:.3f} | {med[KINDS[0]] / med[k]:.2f}x | "
              f"{med[KINDS[2]] / med[k]:.2f}x |")
    same = all(r[2] for r in results)
    print(f"both exact variants the same bits on every member: {same}")
    write_result(args.out, {
        "benchmark": "ring_hops", "machine": machine_info(), "config": vars(args),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg()[0],
        "times": times, "median_s": med, "same_bits": same,
        "total_seconds": time.time() - began})
    if not same:
        raise SystemExit("the reused buffers changed the sums")


if __name__ == "__main__":
    main()
