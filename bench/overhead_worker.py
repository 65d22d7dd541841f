"""The dyntrain side of ``bench/overhead.py``: the same workload as ``bench/ddp_worker.py``, trained
by ``dyntrain.ElasticTrainer``. Start it with ``dyntrain run --workers N --nproc N --out DIR --quiet
bench/overhead_worker.py ARGS``; the step times come from DIR/metrics.jsonl.

Every worker also writes ``steps-<worker>.json`` into the run folder: the wall-clock time and the
process's CPU time at the end of each of its steps (recorded by a wrapper around
``ChunkStepper.finish``; the leader's wall-clock times match metrics.jsonl).

``--profile PREFIX`` times the parts of a step by wrapping the runtime's methods (nothing in the
package is edited) and writes ``PREFIX-<worker>.json`` per worker, averaged over the steps after
``--warmup``; ``--cprofile PREFIX`` writes cProfile statistics (``PREFIX-<worker>.txt``) instead.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import torch

import dyntrain
from ddp_worker import (  # bench/ is sys.path[0] when run as a script
    add_workload_args,
    cross_entropy,
    make_dataset,
    make_model,
    make_optimizer,
)
from dyntrain.elastic.collective.reducer import StepReduction
from dyntrain.elastic.step import stepper as stepper_module
from dyntrain.elastic.step.buffers import BatchNormChunkStats
from dyntrain.elastic.step.stepper import ChunkStepper
from dyntrain.elastic.worker.channel import WorkerChannel


class PartTimer:
    """Accumulates wall time per label over the steps after ``warmup``."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.steps = 0
        self.measured = 0
        self.started: float | None = None
        self.ended: float | None = None

    def wrap(self, label: str, fn):
        clock = time.perf_counter

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.started is not None:
                    self.total[label] += clock() - t0
                    self.calls[label] += 1

        return timed

    def patch(self, owner, name: str, label: str) -> None:
        raw = inspect.getattr_static(owner, name)
        if isinstance(raw, staticmethod):
            setattr(owner, name, staticmethod(self.wrap(label, raw.__func__)))
        else:
            setattr(owner, name, self.wrap(label, getattr(owner, name)))

    def step_done(self) -> None:
        self.steps += 1
        now = time.perf_counter()
        if self.steps == self.warmup:
            self.started = now
        elif self.started is not None:
            self.measured += 1
            self.ended = now

    def report(self) -> dict:
        n = max(self.measured, 1)
        step = (self.ended - self.started) / n if self.started and self.ended else float("nan")
        return {"steps_measured": self.measured, "step_ms": 1000 * step,
                "parts_ms_per_step": {k: 1000 * v / n for k, v in sorted(self.total.items())},
                "calls_per_step": {k: v / n for k, v in sorted(self.calls.items())}}


def install_timers(timer: PartTimer, trainer: dyntrain.ElasticTrainer) -> None:
    """Wrap the runtime's pieces; labels with a dot are nested inside the label before the dot."""
    st = trainer.stepper
    # Top level of ElasticTrainer._train: start (chunks, buckets sent during the last backward),
    # ctl, finish (wait for the sums, apply), metrics send.
    timer.patch(ChunkStepper, "start", "compute")
    timer.patch(WorkerChannel, "ctl", "ctl_read")
    timer.patch(WorkerChannel, "send", "send_metrics")
    finish = ChunkStepper.finish

    def finish_and_count(self, *args, **kwargs):
        try:
            return timed_finish(self, *args, **kwargs)
        finally:
            timer.step_done()

    timed_finish = timer.wrap("finish", finish)
    ChunkStepper.finish = finish_and_count
    timer.patch(StepReduction, "finish", "finish.wait_sums")
    timer.patch(ChunkStepper, "_apply_meta", "finish.apply")
    # Inside compute.
    timer.patch(st.parts.optimizer, "zero_grad", "compute.zero_grad")
    timer.patch(BatchNormChunkStats, "begin_step", "compute.bn_begin_step")
    timer.patch(BatchNormChunkStats, "before_chunk", "compute.bn_before_chunk")
    timer.patch(BatchNormChunkStats, "record_chunk", "compute.bn_record_chunk")
    timer.patch(stepper_module, "chunk_seed", "compute.chunk_seed")
    timer.patch(stepper_module.torch, "manual_seed", "compute.manual_seed")
    timer.patch(ChunkStepper, "_fetch", "compute.fetch")
    st.loss_fn = timer.wrap("compute.forward", st.loss_fn)
    timer.patch(torch.Tensor, "backward", "compute.backward")
    # Inside apply.
    timer.patch(BatchNormChunkStats, "finish_step", "finish.bn_finish_step")
    timer.patch(st.parts.optimizer, "step", "finish.optimizer_step")


def record_steps() -> tuple[list[float], list[float]]:
    """Wrap ``ChunkStepper.finish`` to note wall and CPU time at the end of every step."""
    times: list[float] = []
    cpu: list[float] = []
    finish = ChunkStepper.finish

    def finish_and_record(self, *args, **kwargs):
        result = finish(self, *args, **kwargs)
        times.append(time.time())
        cpu.append(time.process_time())
        return result

    ChunkStepper.finish = finish_and_record
    return times, cpu


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(ap)
    ap.add_argument("--chunk-size", type=int, default=None, help="default: the global batch")
    ap.add_argument("--float32-reduction", action="store_true",
                    help="TrainConfig(exact_reduction=False): all-reduce float32 like DDP")
    ap.add_argument("--float64-allreduce", action="store_true",
                    help="TrainConfig(exact_ring=False): exact, by a float64 all-reduce")
    ap.add_argument("--no-overlap", action="store_true",
                    help="TrainConfig(overlap=False): sum the buckets after backward")
    ap.add_argument("--profile", default=None, metavar="PREFIX")
    ap.add_argument("--cprofile", default=None, metavar="PREFIX")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = args.global_batch
    config = dyntrain.TrainConfig(global_batch=g, chunk_size=args.chunk_size or g, epochs=1,
                                  max_steps=args.steps, seed=args.seed,
                                  exact_reduction=not args.float32_reduction,
                                  overlap=not args.no_overlap,
                                  exact_ring=not args.float64_allreduce)
    data = make_dataset(args.steps * g, args.seed)
    model = make_model(args.width, args.seed, args.hidden)
    trainer = dyntrain.ElasticTrainer(config, model, make_optimizer(model, args.lr), data,
                                      cross_entropy)
    worker = os.environ.get("DYNTRAIN_WORKER_ID", "local")
    times, cpu = record_steps()
    try:
        run(args, trainer, worker)
    finally:
        out = Path(os.environ.get("DYNTRAIN_OUT", "."))
        record = {"worker": worker, "rank": trainer.rank, "world_size": trainer.world_size,
                  "chunk_size": config.chunk_size, "times": times, "cpu": cpu}
        (out / f"steps-{worker}.json").write_text(json.dumps(record) + "\n")


def run(args: argparse.Namespace, trainer: dyntrain.ElasticTrainer, worker: str) -> None:
    if args.profile:
        timer = PartTimer(args.warmup)
        install_timers(timer, trainer)
        try:
            trainer.fit()
        finally:
            record = {"worker": worker, "rank": trainer.rank, "world_size": trainer.world_size,
                      "chunk_size": trainer.config.chunk_size, **timer.report()}
            Path(f"{args.profile}-{worker}.json").write_text(json.dumps(record, indent=1) + "\n")
    elif args.cprofile:
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        try:
            prof.runcall(trainer.fit)
        finally:
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(40)
            Path(f"{args.cprofile}-{worker}.txt").write_text(out.getvalue())
    else:
        trainer.fit()


if __name__ == "__main__":
    main()
