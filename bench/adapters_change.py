"""What a change of size costs a LightningModule and a Hugging Face ``Trainer`` trained through
dyntrain's adapters: one ``dyntrain run`` each, through a join, a leave and a kill.

The two workloads are the adapters' test scripts: ``tests/scripts/lightning_train.py`` (a small
classifier with BatchNorm and dropout, SGD with momentum and a step scheduler, a
LightningDataModule; ``--step-delay`` stretches each chunk, and each step is held 0.5 s longer
until the joiner, which imports Lightning, is in) and
``tests/scripts/transformers_train.py`` (a tiny GPT-2 built from a config, AdamW with warm-up and
decay as ``Trainer`` builds them; its chunks are held 0.5 s longer until the world first reaches
3 workers, so that the joiner, which imports transformers, lands mid-run). Each runs
``dyntrain run --workers 1:3 --nproc 2`` (the fork server, as by default) with ``--events``: a
join (2 -> 3), a leave (3 -> 2) and a kill (2 -> 1) at fixed steps.

Per change, from the run's ``events.jsonl`` and ``metrics.jsonl``: the latency (the request ->
the first step of the new world) and the training stopped (the last step of the world before ->
the first step of the new one; a joiner starts while the members train), the steps computed
again, and whether the run ended with every step once.

    .venv/bin/python bench/adapters_change.py       # about 3-6 minutes on 2 loaded cores

Writes ``bench/results/adapters_change.json`` (docs/benchmarks/adapters-change.md is generated
from it by ``bench/report.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from _common import machine_info  # noqa: E402

RESULTS = BENCH / "results" / "adapters_change.json"
SCRIPTS = ROOT / "tests" / "scripts"
WORKLOADS = {
    "Lightning": (["--events", "step=3:join=1,step=150:leave=1,step=200:kill=1"],
                  [str(SCRIPTS / "lightning_train.py"), "--epochs", "40", "--step-delay",
                   "0.05", "--hold", "HOLD"]),
    "Hugging Face Trainer": (["--events", "step=1:join=1,step=24:leave=1,step=34:kill=1"],
                             [str(SCRIPTS / "transformers_train.py"), "--hold-until-world",
                              "3"]),
}
HEADERS = ["adapter", "change", "at step", "latency, s", "training stopped, s",
           "steps computed again", "every step once"]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(name: str, events: list[str], script: list[str], work: Path) -> dict:
    out = work / name.split()[-1].lower()
    cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "1:3", "--nproc", "2",
           "--out", str(out), "--quiet", *events, *script]
    hold = work / "hold"
    cmd = [str(hold) if a == "HOLD" else a for a in cmd]
    hold.touch()
    t0 = time.time()
    with open(work / "output.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:  # held slow until the joiner (which imports its framework) is in
            while proc.poll() is None and hold.exists():
                events = out / "events.jsonl"
                if events.exists() and any(e["event"] == "join" for e in read_jsonl(events)):
                    hold.unlink()
                time.sleep(0.2)
            hold.unlink(missing_ok=True)
            code = proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
    wall = time.time() - t0
    if code != 0:
        return {"status": f"exit code {code}",
                "tail": (work / "output.log").read_text()[-1500:], "changes": []}
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if "step" in r]
    changes = []
    for e in read_jsonl(out / "events.jsonl"):
        if e["event"] == "start":
            continue
        new = [r for r in steps if r["gen"] == e["generation"]]
        old = [r for r in steps if r["gen"] < e["generation"]]
        stopped = new[0]["time"] - old[-1]["time"] if new and old else None
        changes.append({"event": e["event"], "world": f"{e['world_before']} -> "
                        f"{e['world_after']}", "start_step": e.get("start_step"),
                        "latency_s": e.get("latency_s"),
                        "stopped_s": None if stopped is None else round(stopped, 3),
                        "steps_redone": e.get("steps_redone", 0)})
    once = [r["step"] for r in steps] == list(range(1, len(steps) + 1))
    return {"status": "finished", "wall_s": round(wall, 1), "steps": len(steps),
            "every_step_once": once, "changes": changes, "command": " ".join(
                ["dyntrain", *cmd[3:]]).replace(str(out), "OUT").replace(str(hold), "HOLD")
            .replace(f"{ROOT}/", "")}


def main() -> int:
    load_before = os.getloadavg()
    t0 = time.time()
    results = {}
    with tempfile.TemporaryDirectory(prefix="adapters_change_") as tmp:
        for name, (events, script) in WORKLOADS.items():
            print(f"[{time.strftime('%H:%M:%S')}] {name}", file=sys.stderr, flush=True)
            results[name] = run(name, events, script, Path(tmp))
    rows = []
    for name, r in results.items():
        for c in r["changes"]:
            rows.append([name, f"{c['event']} {c['world']}", str(c["start_step"]),
                         "–" if c["latency_s"] is None else f"{c['latency_s']:.2f}",
                         "–" if c["stopped_s"] is None else f"{c['stopped_s']:.2f}",
                         str(c["steps_redone"]), "yes" if r["every_step_once"] else "no"])
        if not r["changes"]:
            rows.append([name, r["status"], "–", "–", "–", "–", "–"])
    for row in rows:
        print("  ".join(row))
    result = {"benchmark": "adapters_change",
              "command": ".venv/bin/python bench/adapters_change.py",
              "machine": {**machine_info(), "loadavg_before": load_before,
                          "loadavg_after": os.getloadavg()},
              "wall_s": round(time.time() - t0, 1), "headers": HEADERS, "rows": rows,
              "runs": results}
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0 if all(r["status"] == "finished" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
