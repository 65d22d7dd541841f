"""``dyntrain compare``: how far apart two runs' final parameters and buffers are."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dyntrain.errors import DyntrainError


def state_distance(a: dict, b: dict) -> dict:
    """Max absolute and relative difference over all floating tensors; exact match of the rest.
    A NaN matches a NaN at the same place; ``nan_in_one`` counts the values NaN in one only
    (left out of the differences, which they would make NaN)."""
    if a.keys() != b.keys():
        keys = sorted(a.keys() ^ b.keys())
        raise DyntrainError(f"the two state dicts have different keys: {keys}")
    max_abs, max_norm, exact_other, nan_in_one = 0.0, 0.0, True, 0
    for key in a:
        x, y = a[key], b[key]
        if x.shape != y.shape:
            raise DyntrainError(f"{key}: shapes differ ({tuple(x.shape)} vs {tuple(y.shape)})")
        if x.is_floating_point():
            nan_x, nan_y = x.isnan(), y.isnan()
            nan_in_one += int((nan_x ^ nan_y).sum())
            delta = (x.double() - y.double()).masked_fill(nan_x | nan_y, 0.0)
            max_abs = max(max_abs, float(delta.abs().max()) if delta.numel() else 0.0)
            scale = float(y.double().masked_fill(nan_y, 0.0).norm()) or 1.0
            max_norm = max(max_norm, float(delta.norm()) / scale)
        else:
            exact_other = exact_other and bool((x == y).all())
    return {"max_abs_diff": max_abs, "max_rel_norm_diff": max_norm,
            "non_float_equal": exact_other, "nan_in_one": nan_in_one, "tensors": len(a)}


def load_state(path: str) -> dict:
    """The state dict in a run folder's ``final.pt`` or in a file; either may be a local path
    or an object-store URL (``s3://bucket/run``)."""
    import io

    import torch

    from dyntrain.elastic.runs.storage import is_url, open_store

    if is_url(path):
        root, _, last = path.rstrip("/").rpartition("/")
        store, name = ((open_store(root), last) if last.endswith((".pt", ".pth"))
                       else (open_store(path), "final.pt"))
        shown = store.where(name)
        try:
            data = io.BytesIO(store.get(name))
        except FileNotFoundError:
            raise DyntrainError(f"no such file: {shown}") from None
    else:
        p = Path(path)
        if p.is_dir():
            p = p / "final.pt"
        if not p.is_file():
            raise DyntrainError(f"no such file: {p}")
        data, shown = p, str(p)
    try:
        return torch.load(data, weights_only=True, map_location="cpu")
    except Exception as exc:
        raise DyntrainError(f"{shown}: not a loadable state dict ({type(exc).__name__})") from None


@click.command()
@click.argument("run_a")
@click.argument("run_b")
@click.option("--atol", default=1e-5, show_default=True, help="Tolerance for the verdict.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def compare(run_a, run_b, atol, as_json):
    """Compare two runs' final.pt (a run folder or a file, local or an object-store URL such
    as s3://bucket/run); exit 1 if they differ beyond ATOL."""
    result = state_distance(load_state(run_a), load_state(run_b))
    result["allclose"] = (result["max_abs_diff"] <= atol and result["non_float_equal"]
                          and not result["nan_in_one"])
    numerics = numerics_differences(run_a, run_b)
    if numerics is not None:
        result["numerics_differences"] = numerics
    if as_json:
        click.echo(json.dumps(result))
    else:
        verdict = "match" if result["allclose"] else "DIFFER"
        click.echo(f"{verdict}: max |a-b| = {result['max_abs_diff']:.3g} over {result['tensors']} "
                   f"tensors (relative {result['max_rel_norm_diff']:.3g}); integer buffers "
                   f"{'equal' if result['non_float_equal'] else 'differ'}"
                   + (f"; {result['nan_in_one']} value(s) NaN in one run only"
                      if result["nan_in_one"] else ""))
        if numerics:
            click.echo("the runs computed with other numerics (numerics.json): "
                       + "; ".join(numerics))
        elif numerics is not None and not result["allclose"]:
            click.echo("the runs recorded the same numerics: the difference lies elsewhere "
                       "(the data, the script, a setting they do not name)")
    raise SystemExit(0 if result["allclose"] else 1)


def numerics_differences(run_a: str, run_b: str) -> list[str] | None:
    """What differs between the numerics two run folders recorded (``numerics.json``): their
    pins, what their first workers computed with, their canaries, mixed workers. None when
    either is not a run folder or neither records numerics; a phrase for one that records
    none."""
    from dyntrain.elastic.numerics import shown
    from dyntrain.elastic.runs.folder import read_numerics
    from dyntrain.elastic.runs.storage import StorageError, is_url, open_store

    records = []
    for run in (run_a, run_b):
        if run.endswith((".pt", ".pth")) or (not is_url(run) and not Path(run).is_dir()):
            return None
        try:
            records.append(read_numerics(open_store(run)))
        except (OSError, StorageError, DyntrainError) as exc:
            return [f"{run}: {exc}"]
    a, b = records
    if a is None and b is None:
        return None  # neither run recorded its numerics (a run of an older dyntrain): no word
    missing = [f"{run} records no numerics" for run, r in ((run_a, a), (run_b, b)) if r is None]
    if missing:
        return missing
    out = []
    if (a.pinned is None) != (b.pinned is None):
        pinned, alone = (run_a, run_b) if b.pinned is None else (run_b, run_a)
        out.append(f"{pinned} pinned its numerics, {alone} trained alone without a pin")
    elif a.pinned != b.pinned:
        pins = [a.pinned.to_json(), b.pinned.to_json()]
        out += [f"pinned {k} {pins[0][k]} vs {pins[1][k]}" for k in sorted(pins[0])
                if pins[0][k] != pins[1][k]]
    out += [f"{k} {shown(a.settings.get(k))} vs {shown(b.settings.get(k))}"
            for k in sorted(set(a.settings) | set(b.settings))
            if a.settings.get(k) != b.settings.get(k)]
    if a.canary != b.canary:
        out.append(f"canary {a.canary.compute} vs {b.canary.compute}")
    for run, r in ((run_a, a), (run_b, b)):
        if r.mixed:
            out.append(f"{run} admitted workers of other numerics from step "
                       f"{r.bitwise_until} ({', '.join(m.worker for m in r.mixed)})")
    return out
