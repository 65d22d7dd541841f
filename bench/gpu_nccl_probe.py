"""Can two NCCL ranks share one GPU here? Two processes, both on ``cuda:0``, create an NCCL
group and all-reduce one tensor; prints what happened. (NCCL refuses two ranks on one device:
on a one-GPU machine multi-worker GPU tests go over gloo instead, see ``tests/test_gpu.py``.)

    python bench/gpu_nccl_probe.py
"""

import os
import queue
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, port: int, results) -> None:
    try:
        store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=30))
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=30)
        torch.cuda.set_device(0)
        pg = dist.ProcessGroupNCCL(store, rank, 2, opts)
        t = torch.ones(4, device="cuda:0") * (rank + 1)
        pg.allreduce([t]).wait()
        torch.cuda.synchronize()
        results.put((rank, f"ok: sum {t.tolist()}"))
    except Exception as exc:  # the refusal is the finding
        results.put((rank, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"))


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("gpu_nccl_probe: error: no CUDA device")
    print(f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, "
          f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}", flush=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, port, results)) for r in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(90)
        if proc.is_alive():
            proc.kill()
    got = {}
    for _ in procs:
        try:
            rank, said = results.get(timeout=5)
        except queue.Empty:
            break
        got[rank] = said
    for rank in range(2):
        print(f"rank {rank}: {got.get(rank, 'no answer (hung, killed after 90 s)')}")
    os._exit(0)


if __name__ == "__main__":
    main()
