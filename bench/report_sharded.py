"""The benchmark report of sharded data parallelism (``bench/sharded.py``)."""

from __future__ import annotations

from report_pages import Page, Run, md_table, text_block

MB = 1e6
RERUN_NOTE = """
The 100M row at world 1 was run again alone right after the benchmark (its `rerun` entry in the
result file, load 7.6 before, 7.3 after): in the benchmark its worker was declared lost (no
heartbeat for 3 s) while it counted its tensors, which walks every Python object; the memory
runs now pass `--failure-timeout 60`.
"""

AFTER_NOTE = """
The re-shard runs alone (`--setups ''`), written elsewhere and copied here, on the 2-core
machine shared with other test runs (a run of `tests/test_sharded.py` on 2 processes
alongside): 1-minute load 12.5 at the start, 12.5-20 during the 100M run. Each moving tensor's
AdamW state goes from one holder to its new owner alone (`dyntrain.elastic.sharding.moves`), and no
parameter is sent again (none of these changes interrupted a step in the parameters'
broadcast).
"""
VS_FSDP2_NOTE = """
Every shard level beside torch DDP and FSDP2 at the same world and global batch, in one run:
25M at 2 and 4 workers, 100M at 4 (`r / N` below 1 only at 4); no re-shard runs. The code of
9814e0b: at 2 workers with `r = 2` levels 2 and 3 still reduce-scattered every chunk and
broadcast the parameters (see the next run). Nothing else of ours ran on the machine, but for
two short unit tests (about 10 s) during the 25M runs.
"""
SCRATCH_NOTE = """
Levels 0-3 beside DDP and FSDP2 at 4 workers again, after the exact ring's hops stopped
allocating fresh buffers (`ring.Scratch`, commit ba70ff4; `bench/ring_hops.py`: 1.76x
faster ring at 4 workers). Nothing else of ours ran on the machine.
"""
WORLD2_NOTE = """
A world of two with `r = 2` (every member owns every tensor) after the change that makes
levels 2-3 sum there as level 1 does and sends no parameter after a step at levels 1-3 (commit
0b552d0), beside DDP and FSDP2; minutes after the run below, nothing else of ours running.
"""
LEVELS_NOTE = """
Every shard level at 25M (1, 2 and 4 workers) and at 100M (4 workers: `r / N` is below 1 only
there), with `r = 2` and, at level 3, `r = 1`; no DDP or FSDP2 runs here (see the run of
2026-11-27 below). The re-shard runs are at level 3 (`--reshard-level 3`). Nothing else of ours
ran on the machine.
"""
AFTER_100M_NOTE = """
The 100M re-shard run again, right after the run of the code before the change below, when the
machine was less loaded (1-minute load 9.0 at the start, 7.0 at the end; 3-9 across both runs,
nothing else of ours running).
"""
BEFORE_100M_NOTE = """
The code before the change (commit 33c5468), right before the run above (load 3.1 at the start,
9.1 at the end); its probe timed `OptimizerShards`' methods (see the note of the earlier
before-run below).
"""
BEFORE_NOTE = """
The same re-shard runs with the code before the change (commit 33c5468: each move a broadcast
over the whole generation group, then every parameter sent again), minutes before the run above
at a similar load (25M: 7.7 before, 16.4 after; 100M: 13.1 before, 14.1 after; a run of four
test files alongside). The two runs were separate invocations (`--reshard-models 25m`, then
`100m`), merged into one file; their probe timed `OptimizerShards`' methods, so "state moves"
is `_move` and "parameters sent again" `_send_params`, and the parameters received are the
model's bytes to each of the other members, what that code sent.
"""


def _goal(setup: dict, world: int, from_level: int = 1) -> float:
    """The fraction of the unsharded bytes of a part a member should hold, where the part is
    sharded from shard level ``from_level`` on (the optimizer state: 1; the parameters: 3)."""
    if setup["system"] == "fsdp2":
        return 1 / world
    if setup["system"] == "dyntrain" and setup["level"] >= from_level:
        return min(setup["redundancy"], world) / world
    return 1.0


def _memory(data: dict) -> str:
    level0 = {r["model"]: r for r in data["runs"] if "error" not in r
              and r["setup"]["system"] == "dyntrain" and r["setup"]["level"] == 0}
    rows = []
    for r in data["runs"]:
        if "error" in r:
            rows.append([r["model"], r["setup"]["name"], r["world"], "failed", "", "", "", "",
                         "", "", ""])
            continue
        ms = r["members"]
        state = [m["optimizer_state_bytes"] for m in ms]
        base = level0.get(r["model"])
        ratio = (f"{max(state) / base['members'][0]['optimizer_state_bytes']:.2f} "
                 f"({_goal(r['setup'], r['world']):.2f})" if base else "")
        spread = (f"{min(state) / MB:.0f}-{max(state) / MB:.0f}" if min(state) != max(state)
                  else f"{max(state) / MB:.0f}")
        params = max(m["params_bytes"] for m in ms)
        params_ratio = (f"{params / base['members'][0]['params_bytes']:.2f} "
                        f"({_goal(r['setup'], r['world'], 3):.2f})" if base else "")
        rows.append([r["model"], r["setup"]["name"], r["world"], f"{params / MB:.0f}",
                     params_ratio,
                     f"{max(m['grads_bytes'] for m in ms) / MB:.0f}", spread, ratio,
                     f"{max(m['other_bytes'] for m in ms) / MB:.0f}",
                     f"{max(m['total_bytes'] - m['data_bytes'] for m in ms) / MB:.0f}",
                     f"{max(m['peak_rss_bytes'] for m in ms) / MB:.0f}"])
    return md_table(["model", "setup", "world", "params MB", "params vs level 0 (goal)",
                     "grads MB", "AdamW state MB per worker", "state vs level 0 (goal)",
                     "other tensors MB", "all tensors MB", "peak RSS MB"], rows,
                    right=range(2, 11))


def _speed(data: dict) -> str:
    ok = [r for r in data["runs"] if "error" not in r and r.get("step_s")]
    base = {(r["model"], r["world"], r["setup"]["system"]): r["samples_per_s"] for r in ok
            if r["setup"]["system"] in ("ddp", "fsdp2")}

    def vs(r: dict, system: str) -> str:
        other = base.get((r["model"], r["world"], system))
        return f"{r['samples_per_s'] / other:.2f}x" if other else ""

    rows = [[r["model"], r["world"], r["setup"]["name"], f"{r['step_s']:.2f}",
             f"{r['samples_per_s']:.2f}", vs(r, "ddp"), vs(r, "fsdp2"),
             f"{r['load_before']:.1f} / {r['load_after']:.1f}"]
            for r in sorted(ok, key=lambda r: (r["parameters"], r["world"]))]
    return md_table(["model", "world", "setup", "step s (median)", "samples/s", "vs DDP",
                     "vs FSDP2", "load before / after"], rows, right=(1, 3, 4, 5, 6))


def _parts(change: dict) -> dict[str, float]:
    """The slowest member's seconds per part of the re-sharding; a run of before the parts
    were recorded (the probe then timed ``OptimizerShards``' methods: ``phases``) maps them."""
    if "parts_s" in change:
        return change["parts_s"]
    if not all("phases" in m for m in change["members"]):
        return {}  # not recorded
    names = {"_survey": "survey", "_move": "moves", "_send_params": "params"}
    return {part: max(m.get("phases", {}).get(method, 0.0) for m in change["members"])
            for method, part in names.items()}


def _reshard(data: dict) -> str:
    rows = []
    for run in data["reshard"]:
        if "error" in run:
            rows.append([run["model"], "failed", *[""] * 12])
            continue
        for c in run["changes"]:
            step = c["step_s_at_world_after"]
            # before point-to-point moves every member got every parameter again from a
            # holder: the model's bytes to each of the others
            params = c.get("params_received_bytes", c["param_bytes"] * (c["world_after"] - 1))
            parts = _parts(c)
            event = c["event"]
            rows.append([run["model"], c["change"], f"{c['world_before']} -> {c['world_after']}",
                         f"{c['latency_s']:.2f}",
                         f"{event['reformed_at'] - event['requested_at']:.2f}",
                         f"{event['first_step_at'] - event['reformed_at']:.2f}",
                         f"{c['reshard_s']:.2f}",
                         *(f"{parts[k]:.2f}" if k in parts else "" for k in ("moves", "params")),
                         "" if c["state_sync_s"] is None else f"{c['state_sync_s']:.2f}",
                         "" if step is None else f"{step:.2f}",
                         f"{c['state_needed_bytes'] / MB:.0f}",
                         f"{c['state_received_bytes'] / MB:.0f}", f"{params / MB:.0f}"])
    loads = "; ".join(f"{r['model']}: {r['load_before']:.1f} before, {r['load_after']:.1f} "
                      "after" for r in data["reshard"])
    return (md_table(["model", "change", "world", "latency s", "of which: to the new world",
                      "then to its first step", "re-sharding s", "of which: state moves s",
                      "parameters sent again s", "state hand-over s",
                      "step s in the new world", "state needed MB", "state received MB",
                      "parameters received MB"], rows, right=range(3, 14))
            + f"\n\nLoad (1-minute average) of the re-shard runs: {loads}.")


def _failures(data: dict) -> str:
    failed = [r for r in data["runs"] + data["reshard"] if "error" in r]
    return "\n\n".join(
        f"{r['model']} {r.get('setup', {}).get('name', 're-shard run')} "
        f"{'at world ' + str(r['world']) if 'world' in r else ''} failed:\n\n"
        + text_block(r["error"][-1500:]) for r in failed)


def _spec(spec: str) -> str:
    """``25m=4;100m=3`` as ``25m: 4, 100m: 3``."""
    return spec.replace("=", ": ").replace(";", ", ")


def _sharded(data: dict, run: Run) -> str:
    cfg = data["config"]
    runs = f"steps per run: {_spec(cfg['steps'])}; " if data["runs"] else "no memory runs; "
    reshard = (f"the re-shard runs: {_spec(cfg['reshard_steps'])} steps with "
               f"`{data['reshard'][0]['events']}`" if data["reshard"] else "no re-shard runs")
    parts = [f"Global batch {cfg['global_batch']} windows of {cfg['seq_len']} bytes, "
             f"micro-batches (chunks) of {cfg['chunk_size']}, {runs}{reshard}. "
             f"Whole benchmark: {data['total_seconds'] / 60:.0f} minutes.", ""]
    if data["runs"]:
        parts += ["### Memory per worker", "",
                  "The largest member's figures (the AdamW state: smallest-largest member). "
                  "\"state vs level 0\": the largest member's optimizer state over the "
                  "unsharded one, the goal (`r / N`, `min(r, N) / N`; FSDP2 `1 / N`) in "
                  "brackets; \"params vs level 0\" likewise for the parameters a member holds "
                  "between steps (sharded at level 3 only).", "", _memory(data), "",
                  "### Step time", "", _speed(data), ""]
    if data["reshard"]:
        parts += [f"### Re-sharding at level {cfg.get('reshard_level', 1)} (`r = 2`)", "",
                  _reshard(data)]
    failures = _failures(data)
    if failures:
        parts += ["", "### Runs that failed", "", failures]
    return "\n".join(parts)


SHARDED = Page(
    slug="sharded",
    title="Sharded data parallelism",
    headline="Memory per worker at levels 0-3, speed beside DDP and FSDP2, and re-shard latency "
             "(GPT 25M/100M)",
    what="""
dyntrain's shard levels (level 0: every worker holds everything; level 1, ZeRO-1: the AdamW
state owned by whole tensors, `r` copies of each; level 2, ZeRO-2: the reduced gradients
summed to their owners too; level 3, ZeRO-3: the parameters held between uses by their owners
only, gathered per transformer block) beside plain torch DDP and torch's FSDP2
(`fully_shard` per transformer block and the root), on the GPT workload
(`dyntrain.workloads.gpt`, presets `25m` and `100m`) with AdamW, weight decay and clipping by
the global norm, one torch thread per worker, gloo on loopback. Every setup trains the same
global batch in the same micro-batches (dyntrain's chunks; DDP and FSDP2 accumulate them and
synchronise the last).

- **Memory**: after the last step (before the final checkpoint), every worker counts the bytes
  of the tensor storages it holds (found through Python's garbage collector, each storage once):
  parameters, gradients (`.grad`), optimizer state, and the other tensors (dyntrain: the flat
  float64 chunk sums, the reduction buffers, level 1's parameter-broadcast buffers; the data set
  left out), and reads its peak RSS so far (`VmHWM`). Tensors that only C++ holds are not
  counted: DDP's gradient buckets (one more copy of the gradients) and gloo's buffers; the RSS
  includes them.
- **Step time**: the median time between step ends, the first and the last step left out
  (the last includes the count), in one run per setup and world; samples/s = global batch /
  step time. The runs follow one another, so the load differs from run to run: compare within
  a world size, and read the load column.
- **Re-sharding**: one `dyntrain run --workers 1:3 --nproc 3` at level 1, `r = 2`: a graceful
  leave (3 -> 2), a join (2 -> 3) and a SIGKILL (3 -> 2). Per change: the latency of
  `events.jsonl` (the request, or the joiner's hello, to the first step completed in the new
  world: it includes that step); the state hand-over of the replicated part (parameters and
  the like, to the joiner); the time in `OptimizerShards.reshard` (from the last member's entry,
  which the plan's all-reduce waits for, to the last member's exit: that all-reduce, the moves
  of optimizer state, and the parameters where they are sent again), and of it the slowest
  member's time in the state moves and in sending parameters again; the bytes of AdamW state the
  ownership change requires (the state of every tensor the diff of the plans,
  `shardplan.diff_plans`, gives a new owner) against what the members received (counted by the
  transfer, `moves.MoveStats`; before point-to-point moves each move was a broadcast to every
  member); and the bytes of parameters the members received (before: every parameter again,
  the model's bytes to each of the other members; now none, unless a step was interrupted in
  the parameters' broadcast).
""",
    command=".venv/bin/python bench/sharded.py",
    runs=[Run("sharded-ring-scratch.json", "Four workers after the ring's hop buffers were "
              "reused, run of 2026-11-28", note=SCRATCH_NOTE),
          Run("sharded-world2.json", "A world of two after the change for N <= r, run of "
              "2026-11-28", note=WORLD2_NOTE),
          Run("sharded-vs-fsdp2.json", "Every level beside DDP and FSDP2, run of 2026-11-28",
              note=VS_FSDP2_NOTE),
          Run("sharded-levels.json", "Levels 2 and 3 beside 0 and 1, and re-sharding at level 3, "
              "run of 2026-11-28", note=LEVELS_NOTE),
          Run("sharded-reshard-100m.json", "Re-sharding at 100M with point-to-point moves, at a "
              "lower load, run of 2026-11-27", note=AFTER_100M_NOTE),
          Run("sharded-reshard-100m-before.json", "Re-sharding at 100M before point-to-point "
              "moves (the code of 33c5468), at a lower load, run of 2026-11-27",
              note=BEFORE_100M_NOTE),
          Run("sharded-reshard.json", "Re-sharding with point-to-point moves, run of 2026-11-27",
              note=AFTER_NOTE),
          Run("sharded-reshard-before.json", "Re-sharding before point-to-point moves (the "
              "code of 33c5468), run of 2026-11-27", note=BEFORE_NOTE),
          Run("sharded.json", "Run of 2026-11-27", note=RERUN_NOTE)],
    tables=_sharded,
    reading="""
**After the ring's hop buffers were reused (the first run).** The exact ring allocated a fresh
tensor for what each hop receives and for each float64 partial sum, and a fresh tensor of
megabytes costs page faults on every use. Reused, the 100M step at 4 workers went from 5.47 to
3.96 s at level 0 and from 4.65 to 4.02 s at level 1 (two runs at load 3.6-4.4), and levels 0-2
now run at 0.93x-0.95x FSDP2's samples/s, 0.91x-0.93x DDP's. Level 3 stays at
0.78x FSDP2's (4.84 s): its gathers are not the ring's.

**Beside FSDP2 at every level (the second and third runs, 2026-11-28).** At 25M with 4 workers every
level ran faster than FSDP2 (1.06x-1.50x its samples/s; level 1 1.39x, level 3 1.23x with
`r = 2`) and slower than DDP (0.56x-0.79x). At 100M with 4 workers none reached 0.9x FSDP2's
samples/s: 0.71x-0.83x (level 1 0.83x, level 3 0.80x with `r = 2` and 0.81x with
`r = 1`), 0.67x-0.79x DDP's. In a world of two, after the change for `N <= r`, levels 1-3 ran at
1.19x-1.24x FSDP2's at 25M and 1.15x-1.25x at 100M (0.57x-0.62x DDP's); before it, levels 2
and 3 took 1.35 s a step at 25M against level 1's 0.87 s (0.70x FSDP2's). One run per setup,
the setups one after another, load 2-4.7. Against DDP, a likely cost is the exact reduction
itself: each hop of dyntrain's ring adds in float64 and forwards float64 partial sums, sent
point to point from Python, where gloo's all-reduce adds float32 in C++; with 4 processes on 2
cores that arithmetic competes with the others' backward. Not profiled.

**Levels 2 and 3 (run of 2026-11-28).** At 4 workers with `r = 2` every sharded part is at its
ideal: the AdamW state at 0.50 of level 0's at levels 1-3, and at level 3 the parameters a member
holds between steps too (0.50 at 25M and 100M; with `r = 1` 0.28 and 0.26 against the ideal 0.25,
whole tensors). What is not sharded yet is the float32 gradient buffer of the whole model (4 bytes
per parameter: backward writes every chunk's gradients into it at every level; the recycled bucket
buffers that would shrink it are not built), and levels 2-3 add the float64 sums of the tensors a
member is primary for (about 2 bytes per parameter here). So at 100M a level-3 member's tensors come
to 1595 MB against level 0's 1991 MB (0.80), 1113 MB with `r = 1` (0.56). Peak RSS does not fall
with them (2703 MB against 2425 MB at 100M): a level-3 member holds the whole model again from a
generation's start to the end of its first step and for a checkpoint or a validation (the last step
here has both), and freed storage goes back to the allocator, not necessarily to the system. Level 1
keeps the parameters' broadcast buffers (4 bytes per parameter in "other"); level 3 has none. The
step times at 100M, 4 workers, are within about 20% of one another (4.09-4.98 s, load 2.6-4.0, one
run each); at 25M, 2 workers, levels 2 and 3 took 1.3 s against 0.85 s at levels 0-1. There, with `r
= N`, nothing is sharded, yet each chunk's sum went to its tensor's primary and was then forwarded
to the other owner, and every parameter was broadcast after the step: fixed since (the first run
above). Re-sharding at level 3 (`r = 2`, 100M): 0.69 / 1.19 / 0.71 s for a leave / join / crash
(each under 2 s), the moves of AdamW state exactly the bytes the ownership change needs, and the
parameters sent again from their holders (397 MB per survivor, 795 MB for the join), which is most
of it (0.46-0.84 s): at level 3 only the holders have them.

**Memory.** Level 1 shards the AdamW state as designed: the largest member holds 0.50 of the
unsharded state at 4 workers with `r = 2` (ideal `r / N` = 0.50) and 0.28 with `r = 1` (ideal 0.25:
whole tensors, so the largest member holds up to one tensor more than its share), and 0.50 at
100M with 2 workers and `r = 1`. Parameters and gradients stay whole at level 1 (sharding them
is levels 2 and 3; FSDP2 holds 1/N of all three), and level 1 adds the parameters' broadcast
buffers (4 bytes per parameter, "other tensors"): at 25M, 4 workers, `r = 2` a member's tensors
come to what level 0 holds (511 MB against 510 MB), with `r = 1` to 465 MB. Level 0's "other"
also holds the float64 chunk sum (8 bytes per parameter) where a member computes several
chunks (world 1 and 2 here, not 4); with the reduction buffers it is why a dyntrain worker's
peak RSS is above DDP's (1.3 GB against 0.94 GB at 25M, 2 workers; 4.1 GB against 2.6 GB at 100M).

**Step time (run of 2026-11-27).** At 25M dyntrain level 1 (`r = 2`) ran at 1.62x (2 workers) and
1.91x (4 workers) FSDP2's samples/s and 0.90x-1.09x DDP's; at 100M, 2 workers, level 0 and level 1
(`r = 1`) ran at 1.54x and 1.44x FSDP2's: at least 0.9x FSDP2's samples/s in
every run that day, with caveats: one run per setup, 2-3 timed steps each, one after the other on a
shared machine, and the FSDP2 runs came later, at a higher load (7.6-9.4) than the dyntrain ones
(1.7-7.9). An earlier run the same hour at load 6-13 (not kept in `bench/results/`) gave the same
order at 25M (FSDP2 1.63 and 1.19 samples/s at 2 and 4 workers, dyntrain level 1 3.58 and 2.73, DDP
2.47 and 0.85) but at 100M, 2 workers, DDP 1.41 samples/s against dyntrain level 0's 0.35: across
runs the load moves these figures by more than the systems differ. FSDP2 on CPU with gloo ran
without error in torch 2.13.

**Re-sharding.** With point-to-point moves the time in the re-sharding at 100M went from 4.91 /
2.25 / 1.72 s to 0.56 / 0.72 / 0.54 s (leave / join / crash) in the pair of runs at load 3-9
(the first two runs above), and from 7.33 / 5.68 / 2.62 s to 1.81 / 3.03 / 0.98 s in the pair at
load 11-20 (the next two, where at 25M it went from 1.65 / 1.57 / 1.01 s to 0.19 / 1.24 / 0.21
s). Before, sending every parameter again took about half of it (0.95-6.2 s at 100M); now no
parameter is sent, and the members receive exactly the state the ownership change needs in every
change (a join: 529 MB at 100M, where the broadcasts carried 1058 MB). At 100M on loopback every
change takes under 2 s at load 3-9, and at load 11-20 the leave and the crash do but not the
join: there the joiner took 3.0 s to receive its whole share (529 MB, two thirds of the AdamW
state), about 175 MB/s, the rate every receiver saw at that load (the leave's two
members 265 MB each in 1.8 s). Those bytes are the minimum of a join at `r = 2`; what remains is
the transport's rate on a loaded machine. The last run (load 6-8) is kept for its memory and
speed tables. In it, the latency to the first step in the new world is dominated by this
machine's step time (3-4 s at 25M, 18-19 s at 100M; at load 12-20 in the runs above, 10-91 s): a
leaver first finishes the step in flight (20 s of the leave's 48 s at 100M), and the new world's
first step is part of the latency. The 25M crash took 305 s: the coordinator formed the new
world 1.4 s after the SIGKILL, but its members began re-sharding 299 s later, about the 300 s
collective timeout: likely a collective that the abort did not cut short, holding up the
survivor's close of its old group (the survivors report before they close it, so the world
formed at once). Not diagnosed: the 100M crash and both crashes of the earlier attempt (7.8 s
and 16.2 s) did not stall, and a small reproduction (4 processes, a member SIGKILLed amid queued
broadcasts or ring sums) failed and closed everything within 0.3 s. A close that takes over 30 s
now says so on the worker's stderr with every thread's stack (`comm.watch_slow`).
""",
)

SHARDED_PAGES = [SHARDED]
