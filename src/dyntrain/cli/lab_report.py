"""``dyntrain lab report``: steps to result vs batch size, the critical batch size and regimes.

Torch-free: the analysis (:mod:`dyntrain.lab.analysis`, :mod:`dyntrain.lab.noise`,
:mod:`dyntrain.lab.render`) and the figures (:mod:`dyntrain.lab.plots`) are imported when the
command runs, not when the CLI starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from dyntrain.outdir import make_out_dir


def _hint(message: str) -> str:
    if message.endswith("no 'target'"):
        return f"{message}; pass --target VALUE"
    if "none can be inferred" in message:
        return f"{message}; pass --metric COLUMN"
    return message


@click.command()
@click.argument("root", type=click.Path(path_type=Path))
@click.option("--out", "out", type=click.Path(path_type=Path), default=None,
              help="Folder for report.md, summary.json and the PNGs (default ROOT/report).")
@click.option("--noise", "noise_specs", multiple=True, metavar="[NAME=]PATH",
              help="A dyntrain metrics.jsonl with b_simple records; repeatable.")
@click.option("--target", type=float, default=None,
              help="Target metric value for every study (overrides study.json; needed for "
                   "Google's archive, whose study.json has none).")
@click.option("--metric", default=None, metavar="COLUMN",
              help="Metric column of measurements.csv (overrides study.json), e.g. "
                   "val/classification_error.")
@click.option("--quiet", "-q", is_flag=True, help="Print only where the report went.")
def report(root: Path, out: Path | None, noise_specs: tuple[str, ...], target: float | None,
           metric: str | None, quiet: bool) -> None:
    """Report on the studies under ROOT (batch-science layout:
    dataset/model/optimizer/batch_size/{study.json, TRIAL/metadata.json,
    TRIAL/measurements.csv}, ours or Google's archive of Shallue et al.).

    Fits S(B) = S_min·(1 + B_crit/B) per workload, labels each batch size perfect scaling,
    diminishing returns or maximal data parallelism, compares the best learning rates with the
    linear and square-root heuristics, warns when a best trial sits on the edge of the search
    space, and writes report.md, summary.json and PNG plots.
    """
    from dyntrain.lab import plots
    from dyntrain.lab.analysis import analyse
    from dyntrain.lab.noise import load_noise, parse_noise_spec
    from dyntrain.lab.render import summary_lines, to_json, to_markdown
    from dyntrain.lab.results import LabError, read_studies

    if not root.exists():
        raise LabError(f"{root}: no such folder")
    if not root.is_dir():
        raise LabError(f"{root}: not a folder")
    try:
        studies = read_studies(root, target=target, metric=metric)
    except LabError as e:
        raise LabError(_hint(str(e))) from None
    if not any(s.trials for s in studies):
        raise LabError(f"{root}: no finished trials yet ({len(studies)} studies planned); "
                       "let `dyntrain lab sweep` finish, or run it again to resume")
    noise = []
    names: set[str] = set()
    for spec in noise_specs:
        name, path = parse_noise_spec(spec)
        series = load_noise(path, name)
        base, i = series.name, 2
        while series.name in names:
            series.name, i = f"{base}-{i}", i + 1
        names.add(series.name)
        noise.append(series)
    reports = analyse(studies)

    out = make_out_dir(root / "report" if out is None else out, "--out")
    try:
        figures = plots.render(reports, out, noise)
        markdown = to_markdown(reports, figures, noise, base=out, source=root)
        (out / "report.md").write_text(markdown)
        summary = to_json(reports, noise, {k: p.name for k, p in figures.items()})
        (out / "summary.json").write_text(
            json.dumps(summary, indent=2, allow_nan=False, ensure_ascii=False) + "\n")
    except OSError as e:
        where = e.filename or out
        raise LabError(f"{where}: cannot write: {e.strerror}") from None

    if not quiet:
        for line in summary_lines(reports, noise):
            click.echo(line)
        click.echo("")
    click.echo(f"wrote {out / 'report.md'}, {out / 'summary.json'} and {len(figures)} "
               f"plot{'s' if len(figures) != 1 else ''} in {out}")
