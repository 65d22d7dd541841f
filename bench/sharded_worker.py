"""The workers of ``bench/sharded.py``: the GPT workload as a dyntrain member that records what
it holds and how it re-shards, and the same GPT and AdamW under plain DDP or torch's FSDP2.

``dyntrain GPT-ARGS``: run as the script of ``dyntrain run`` (every member). It trains the GPT
workload of ``dyntrain.workloads.gpt`` (``GPT-ARGS`` are its flags) and writes into the run
folder, per member, ``member-<id>.json``: after the last step (before the final checkpoint's
gather) the bytes of the tensors it holds and its peak RSS so far; and ``reshard-<id>.jsonl``:
for every re-sharding (level >= 1) its seconds (and per part: ``OptimizerShards.stats``), the
bytes of optimizer state and parameters it received and sent (``moves.MoveStats``) and the
bytes of the state of the tensors it became a new owner of (what the ownership change
requires). The probes wrap ``OptimizerShards.reshard`` and the ``diff_plans`` that
``dyntrain.elastic.sharding.zero`` calls, in this process only.

``baseline ddp|fsdp2 RANK WORLD PORT OUT GPT-ARGS``: one rank of a plain torch loop (gloo on
127.0.0.1, no agent) over the same model, corpus windows, AdamW groups, clipping and global
batch: each rank computes ``global-batch / WORLD`` samples per step in micro-batches of
``--chunk-size`` (gradient sync on the last only), DDP (``DistributedDataParallel``) or FSDP2
(``fully_shard`` per transformer block, then the root). Rank r writes ``OUT/rank-<r>.json``:
every step's end time and the same census as the dyntrain members after the last step.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import torch


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor that holds ``t``'s bytes on this process (a DTensor's local shard)."""
    return t.to_local() if hasattr(t, "to_local") else t


def _key(t: torch.Tensor) -> tuple[int, int] | None:
    try:
        storage = _local(t).untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None  # a wrapper without storage of its own (its local tensor is counted)
    return (storage.data_ptr(), storage.nbytes())


def census(params, optimizer: torch.optim.Optimizer, data: list[torch.Tensor]) -> dict:
    """Bytes of every tensor storage this process holds (found through the garbage collector,
    each storage once), split into parameters, gradients, optimizer state, the data set and
    the rest (gradient and communication buffers not referenced as ``.grad``), with the peak and
    current RSS."""
    groups = {"params": {_key(q) for q in params},
              "grads": {_key(q.grad) for q in params if q.grad is not None},
              "optimizer_state": {_key(v) for st in optimizer.state.values()
                                  for v in st.values() if isinstance(v, torch.Tensor)},
              "data": {_key(t) for t in data}}
    every = {k for obj in gc.get_objects() if isinstance(obj, torch.Tensor)
             if (k := _key(obj)) is not None}
    named = set().union(*groups.values())
    out = {f"{name}_bytes": sum(k[1] for k in keys if k is not None)
           for name, keys in groups.items()}
    out["other_bytes"] = sum(k[1] for k in every - named)
    out["total_bytes"] = sum(k[1] for k in every | (named - {None}) if k is not None)
    status = Path("/proc/self/status").read_text().splitlines()
    kb = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in status
          if line.startswith(("VmHWM", "VmRSS"))}
    out["peak_rss_bytes"] = kb.get("VmHWM") or resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss * 1024
    out["rss_bytes"] = kb.get("VmRSS")
    return out


def _state_bytes(state: dict) -> int:
    return sum(v.numel() * v.element_size() for v in state.values()
               if isinstance(v, torch.Tensor))


class ReshardProbe:
    """Records each re-sharding of this member into ``reshard-<id>.jsonl`` of the run folder."""

    def __init__(self, out: Path) -> None:
        from dyntrain.elastic.sharding import zero

        self.sharded, self.out = zero, out
        self.diff = None
        reshard, diff_plans = zero.OptimizerShards.reshard, zero.diff_plans

        def timed_reshard(shards, group, gen, me, should_abort):
            self.diff = None
            began, began_at = time.perf_counter(), time.time()
            lost = reshard(shards, group, gen, me, should_abort)
            seconds = time.perf_counter() - began
            moves = self.diff.moves if self.diff is not None else ()
            mine = {m.tensor for m in moves if m.target == me}
            stats = shards.stats
            record = {"generation": gen.number, "world": gen.world_size, "member": me,
                      "members": list(gen.members), "reshard_s": round(seconds, 4),
                      "began_at": began_at, "ended_at": began_at + seconds,
                      "parts_s": {k: round(v, 4) for k, v in stats.seconds.items()},
                      "state_received_bytes": stats.state_received_bytes,
                      "state_sent_bytes": stats.state_sent_bytes,
                      "params_received_bytes": stats.params_received_bytes,
                      # what the ownership change requires: the state of the tensors this
                      # member became a new owner of, as it holds it now
                      "state_needed_bytes": sum(_state_bytes(shards.optimizer.state.get(
                          shards.params[t], {})) for t in mine),
                      "moves": len(moves), "moves_to_me": len(mine),
                      "param_bytes": sum(s.nbytes for s in shards.specs), "lost": len(lost)}
            with open(self.out / f"reshard-{me}.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            return lost

        def recorded_diff(old, new, senders=None):
            self.diff = diff_plans(old, new, senders)
            return self.diff

        zero.OptimizerShards.reshard = timed_reshard
        zero.diff_plans = recorded_diff


def dyntrain_member(argv: list[str]) -> None:
    """One member of ``dyntrain run``: the GPT workload with the probes (module docstring)."""
    from dyntrain.workloads import gpt

    out = Path(os.environ["DYNTRAIN_OUT"])
    args = gpt.build_parser().parse_args(argv)
    if args.shard:
        ReshardProbe(out)
    trainer = gpt.build(args)
    finish, stepper = trainer.stepper.finish, trainer.stepper

    def finish_and_count(*a, **kw):
        result = finish(*a, **kw)
        if trainer.step + 1 == trainer.total_steps:  # the last step, before the final gather
            record = {"worker": trainer.worker_id, "world": trainer.world_size,
                      "parameters": sum(q.numel() for q in stepper.params),
                      **census(stepper.params, trainer.parts.optimizer,
                               list(stepper.dataset.tensors))}
            (out / f"member-{trainer.worker_id}.json").write_text(json.dumps(record))
        return result

    stepper.finish = finish_and_count
    trainer.fit()
    if trainer.is_leader:
        trainer.report(steps=trainer.step)


def baseline(system: str, rank: int, world: int, port: int, out: Path, argv: list[str]) -> None:
    """One rank of the DDP or FSDP2 loop (module docstring)."""
    import torch.distributed as dist
    from torch.nn import functional as F

    from dyntrain.workloads import gpt
    from dyntrain.workloads.gpt_model import GPT, adamw_groups
    from dyntrain.workloads.textcorpus import byte_windows, load_corpus

    args = gpt.build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=600))
    cfg = gpt.model_config(args)
    torch.manual_seed(args.seed)
    model = GPT(cfg)
    if system == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        wrapped = fully_shard(model)
    opt = torch.optim.AdamW(adamw_groups(model, args.weight_decay), lr=args.lr,
                            betas=(0.9, 0.95))
    windows = byte_windows(load_corpus(args.corpus).train, cfg.seq_len).tensors[0]
    local = args.global_batch // world
    micro = range(0, local, args.chunk_size)
    times = [time.time()]
    record: dict = {}
    for step in range(args.max_steps):
        first = step * args.global_batch + rank * local
        for i, start in enumerate(micro):
            last = i == len(micro) - 1
            sync = nullcontext()
            if system == "ddp" and not last:
                sync = wrapped.no_sync()
            elif system == "fsdp2":
                wrapped.set_requires_gradient_sync(last)
            batch = windows[first + start : first + start + args.chunk_size].long()
            with sync:
                logits = wrapped(batch[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
                (loss * batch.shape[0] / args.global_batch * world).backward()
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        times.append(time.time())
        if step == args.max_steps - 1:
            record = census(list(model.parameters()), opt, [windows])
        opt.zero_grad()
    record.update(rank=rank, world=world, system=system, step_end_times=times,
                  parameters=cfg.parameters())
    (out / f"rank-{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def main() -> None:
    if sys.argv[1] == "dyntrain":
        dyntrain_member(sys.argv[2:])
    elif sys.argv[1] == "baseline":
        system, rank, world, port, out = sys.argv[2:7]
        baseline(system, int(rank), int(world), int(port), Path(out), sys.argv[7:])
    else:
        raise SystemExit(f"sharded_worker.py: unknown mode {sys.argv[1]!r}")


if __name__ == "__main__":
    main()
