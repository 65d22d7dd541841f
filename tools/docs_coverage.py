"""Check that every section of an earlier README is still reachable from today's README.

Usage: ``python tools/docs_coverage.py [--old GIT_REF] [--page PATH]`` (default: the README of
the commit before the docs moved to ``docs/``; ``--page docs/architecture.md`` checks the
architecture page that was split into ``docs/architecture/``). Reachable means: README.md, and
every Markdown file that a reachable file links to, recursively. A section counts as covered
when its heading is a heading of a reachable page (or the page that replaced it is named in
``RENAMED``) and every number in it (``0.075``, ``1,013``, ``606x``, ``96%``) occurs in a
reachable page. Prints one line per section and the numbers it misses; exits 1 when anything is
missing.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OLD_REF = "482d602"

# old heading -> the heading (on some reachable page) that holds its content now
RENAMED = {
    "Quick start": "Install",
    "Train elastically": "Running elastically",
    "Use it in your own training script": "Your training script",
    "Input pipeline, gradient clipping, validation": "Input pipeline",
    "Train on images with the ResNet-50 recipe": "The ResNet-50 recipe",
    "Queue and run jobs": "The job service",
    "Use it from boto3 / the AWS CLI": "The AWS Batch API",
    "Measure the limits of data parallelism": "The scaling lab",
    "Results on digits (make lab; the report is in docs/lab/report.md)": "Results on digits",
    "How it keeps the result unchanged": "How the invariant is kept",
    "Benchmarks": "Benchmark reports",
    "Rescale latency (.venv/bin/python bench/rescale_latency.py, about 6 minutes)":
        "Rescale latency",
    "Rescale latency vs model size (.venv/bin/python bench/rescale_size.py, about 5-12 minutes)":
        "Rescale latency vs model size",
    "Worker start-up (.venv/bin/python bench/worker_startup.py --rounds 3, about 6 minutes)":
        "Worker start-up",
    "Steady-state overhead (.venv/bin/python bench/overhead.py --worlds 2 --rounds 3, about 7 "
    "minutes)": "Steady-state overhead against DDP",
    "Mixed-speed workers (.venv/bin/python bench/balance.py, about 5 minutes)":
        "Mixed-speed workers",
    "Chaos soak (.venv/bin/python bench/chaos_soak.py, about 8-10 minutes)": "Chaos soak",
    "Gradient noise scale overhead (.venv/bin/python bench/noise_overhead.py --cli --cli-rounds "
    "2, about 4 minutes)": "Gradient noise scale overhead",
    "Scaling efficiency (dyntrain lab throughput --workers 1,2,4 --mode both --steps 200 "
    "--warmup 20 --repeat 3)": "Scaling efficiency",
    "Input pipeline (bench/loader_throughput.py, bench/train_through_loader.py, "
    "bench/loader_rescale.py)": "Input pipeline",
    "On a Ray cluster": "The service on a Ray cluster",
    "Job service": "Submit throughput",  # the service's benchmarks, one report each
    "On this machine: digits as JPEGs (make demo-images)":
        "On a CPU: digits as JPEGs (make demo-images)",
    # docs/architecture.md, split into docs/architecture/*.md
    "dyntrain architecture": "Architecture",
    "Layers": "Who imports whom",
    "Differences from the sketch": "Design decisions",
    "Input pipeline (src/dyntrain/data)": "The input pipeline (src/dyntrain/data)",
    "The Ray executor (executors/ray.py, ray_actor.py, raycluster.py)": "The Ray executor",
    "Web dashboard and /metrics": "The dashboard and /metrics",
}

# numbers of the earlier README that the generated reports print differently, and why
DIFFERENT = {
    "11.37": "noise overhead, CNN float32 'on' ms: the result file holds 11.365 (printed 11.36)",
    "2.51": "noise overhead, MLP 64/8 'on' ms: the result file holds 2.505 (printed 2.50)",
}

NUMBER = re.compile(r"(?<![\w.])\d[\d,.]*\d[x%]?(?![\w])|(?<![\w.])\d+[x%](?![\w])")
LINK = re.compile(r"\]\(([^)\s]+?\.md)(?:#[^)]*)?\)")


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) pairs of a Markdown text; headings inside code fences do not count."""
    out: list[tuple[str, list[str]]] = [("(top)", [])]
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,6} ", line):
            out.append((clean(line.lstrip("#")), []))
        else:
            out[-1][1].append(line)
    return [(h, "\n".join(body)) for h, body in out]


def clean(heading: str) -> str:
    heading = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", heading.replace("`", ""))
    return re.sub(r"\s+", " ", heading).strip()


def reachable(start: Path) -> dict[Path, str]:
    """Every Markdown file reachable by relative links from ``start``, with its text."""
    seen: dict[Path, str] = {}
    todo = [start.resolve()]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen[path] = path.read_text()
        for target in LINK.findall(seen[path]):
            if "://" not in target:
                todo.append((path.parent / target).resolve())
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default=OLD_REF, help="git ref of the earlier page")
    parser.add_argument("--page", default="README.md",
                        help="the earlier page (default README.md; or docs/architecture.md)")
    args = parser.parse_args()
    old = subprocess.run(["git", "show", f"{args.old}:{args.page}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    pages = reachable(ROOT / "README.md")
    corpus = "\n".join(pages.values())
    headings = {clean(h) for text in pages.values() for h, _ in sections(text)}
    missing_any = False
    print(f"{len(pages)} reachable pages from README.md; sections of {args.old}:{args.page}:")
    for heading, body in sections(old):
        numbers = sorted({n.rstrip(".,") for n in NUMBER.findall(body)})
        missing = [n for n in numbers if n not in DIFFERENT
                   and not re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", corpus)]
        target = RENAMED.get(heading, heading)
        found = heading == "(top)" or heading in headings or target in headings
        missing_any |= bool(missing) or not found
        status = "ok" if found and not missing else "MISSING"
        where = "" if target == heading or heading in headings else f" -> {target!r}"
        print(f"  {status:7} {heading!r}{where}: {len(numbers) - len(missing)}/{len(numbers)} "
              f"numbers" + ("; heading not found" if not found else "")
              + (f"; missing {missing}" if missing else ""))
    for number, why in DIFFERENT.items():
        print(f"  known difference: {number}: {why}")
    return 1 if missing_any else 0


if __name__ == "__main__":
    sys.exit(main())
