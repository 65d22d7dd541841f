"""Which optimizer steps stay bitwise exact when each member steps only the tensors it owns.

The experiments behind ``docs/architecture/sharding.md``: sharded data parallelism is
exact only if stepping a subset of the model's tensors gives every element the bits the step
over the whole model gives it. This runs, on the machine's own kernels (CPU, and CUDA when one is
there):

1. every optimizer and implementation (single-tensor loop, ``foreach``, ``fused``) stepped over
   all tensors, against the same one split into optimizers over disjoint sets of whole tensors;
2. the implementations against each other (which ones a sharded and an unsharded run may mix);
3. an optimizer over slices of tensors cut at unaligned offsets, against the whole tensors;
4. dyntrain's LARS (per-tensor trust ratios) over whole tensors split between members;
5. the global gradient norm: today's float32 norm of the flat buffer against a norm made of
   per-tensor float64 sums of squares added with ``math.fsum`` (which any partition reproduces),
   and the flat norm's dependence on the thread count;
6. a linear layer's forward and backward with its weight at an unaligned address (a view into a
   flat buffer, as ZeRO-3 gathering might make) against its own allocation;
7. torch's Distributed Checkpoint: two gloo processes each save the whole tensors they own (one
   key on both), a world of one without a process group loads it back, and
   ``dcp_to_torch_save`` consolidates it into one ``torch.save`` file.

    .venv/bin/python bench/shard_exactness.py          # 1-2 minutes on a loaded 2-core CPU

Prints one line per check and writes ``bench/results/shard_exactness.json``.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.nn import functional as F

from _common import free_port, write_result  # bench/ is sys.path[0] when run as a script
from dyntrain.recipes.optim import LARS

# sizes that leave a tail after any vector width (1, 7, 33: shorter than one vector)
SIZES = [(1,), (7,), (33,), (64, 65), (1000,), (4099,), (3, 5, 7), (129, 257)]
STEPS = 20

Make = Callable[[list[torch.Tensor]], torch.optim.Optimizer]


def optimizers(device: str) -> dict[str, Make]:
    """Every optimizer the sharded design considers, in each implementation the device has."""
    impls = {"single": {"foreach": False}, "foreach": {"foreach": True},
             "fused": {"fused": True}}
    out: dict[str, Make] = {}
    for impl, kw in impls.items():
        out[f"SGD/{impl}"] = lambda ps, kw=kw: torch.optim.SGD(ps, lr=0.1, **kw)
        out[f"Nesterov+wd/{impl}"] = lambda ps, kw=kw: torch.optim.SGD(
            ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4, **kw)
        out[f"Adam/{impl}"] = lambda ps, kw=kw: torch.optim.Adam(ps, lr=1e-3, **kw)
        out[f"AdamW/{impl}"] = lambda ps, kw=kw: torch.optim.AdamW(
            ps, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, **kw)
        out[f"Adam+amsgrad/{impl}"] = lambda ps, kw=kw: torch.optim.Adam(
            ps, lr=1e-3, amsgrad=True, **kw)
    return out


def make_tensors(device: str, seed: int = 0) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen).to(device) for s in SIZES]
    grads = [[torch.randn(s, generator=gen).to(device) for s in SIZES] for _ in range(STEPS)]
    return params, grads


def train(make: Make, parts: list[list[int]], params0: list[torch.Tensor],
          grads: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Run ``STEPS`` steps with one optimizer per part (a part: indices of whole tensors)."""
    params = [p.clone().requires_grad_(True) for p in params0]
    opts = [make([params[i] for i in part]) for part in parts]
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        for opt in opts:
            opt.step()
    return [p.detach() for p in params]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def check_subsets(device: str) -> dict[str, dict[str, bool]]:
    """1 and 2: whole tensors split between members; implementations against each other."""
    params, grads = make_tensors(device)
    everything = [list(range(len(SIZES)))]
    splits = ([[0, 2, 4, 6], [1, 3, 5, 7]], [[7], [0, 1, 2], [3, 4, 5, 6]],
              [[5, 1], [3], [0, 2, 4, 6, 7]])
    results: dict[str, dict[str, bool]] = {}
    whole_by_opt: dict[str, dict[str, list[torch.Tensor]]] = {}
    for name, make in optimizers(device).items():
        opt_name, impl = name.split("/")
        try:
            whole = train(make, everything, params, grads)
        except (RuntimeError, ValueError) as exc:  # an implementation the device lacks
            results[name] = {"skipped": str(exc).splitlines()[0]}
            continue
        whole_by_opt.setdefault(opt_name, {})[impl] = whole
        results[name] = {"subsets_equal_whole": all(
            same(train(make, list(split), params, grads), whole) for split in splits)}
    for opt_name, by_impl in whole_by_opt.items():
        for impl, whole in by_impl.items():
            if impl != "single":
                results[f"{opt_name}/{impl}"]["equals_single"] = same(whole, by_impl["single"])
    return results


def check_slices(device: str) -> dict[str, bool]:
    """3: the same optimizer over unaligned slices of each tensor (the slices' own optimizer
    state), against the whole tensors."""
    params, grads = make_tensors(device)
    out = {}
    for name, make in optimizers(device).items():
        if not name.endswith("/single") and not name.endswith("/foreach"):
            continue
        try:
            whole = train(make, [list(range(len(SIZES)))], params, grads)
        except (RuntimeError, ValueError):
            continue
        flat0 = torch.cat([p.reshape(-1) for p in params])
        n = flat0.numel()
        cuts = [0, 5, 4099 + 3, n // 2 + 1, n]  # slice boundaries inside tensors, unaligned
        flat = flat0.clone()
        bounds = list(zip(cuts, cuts[1:], strict=False))
        pieces = [flat[a:b].clone().requires_grad_(True) for a, b in bounds]
        opt = make(pieces)
        for step_grads in grads:
            g = torch.cat([x.reshape(-1) for x in step_grads])
            for piece, (a, b) in zip(pieces, bounds, strict=True):
                piece.grad = g[a:b].clone()
            opt.step()
        sliced = torch.cat([p.detach() for p in pieces])
        out[name] = torch.equal(sliced, torch.cat([w.reshape(-1) for w in whole]))
    return out


def check_lars() -> bool:
    """4: LARS's per-tensor trust ratios over whole tensors split between two members."""
    params, grads = make_tensors("cpu")
    make = lambda ps: LARS(ps, lr=0.1, momentum=0.9, weight_decay=1e-4)  # noqa: E731
    whole = train(make, [list(range(len(SIZES)))], params, grads)
    return same(train(make, [[0, 3, 5], [1, 2, 4, 6, 7]], params, grads), whole)


def squares(tensors: list[torch.Tensor]) -> list[float]:
    """Each tensor's sum of squares in float64 (what its owner contributes to the norm)."""
    return [float(torch.sum(t.double() ** 2)) for t in tensors]


def check_norms() -> dict[str, object]:
    """5: the flat float32 norm vs the norm from per-tensor float64 sums of squares added with
    ``math.fsum``; the flat norm's dependence on the thread count."""
    gen = torch.Generator().manual_seed(1)
    tensors = [torch.randn(n, generator=gen) for n in (3_000_000, 123_457, 77, 1_000_001)]
    flat = torch.cat(tensors)
    threads = torch.get_num_threads()
    norms = {}
    for t in sorted({1, 2, threads}):
        torch.set_num_threads(t)
        norms[t] = float(torch.linalg.vector_norm(flat, dtype=torch.float32))
    torch.set_num_threads(threads)
    whole = math.sqrt(math.fsum(squares(tensors)))
    # two members, each with its own tensors' terms, gathered in another order
    gathered = squares(tensors[2:]) + squares(tensors[:2])
    # the wrong way: each member's partial norm, squared and added
    partials = [math.sqrt(math.fsum(squares(tensors[:2]))),
                math.sqrt(math.fsum(squares(tensors[2:])))]
    return {"flat_float32_by_threads": norms,
            "flat_float32_same_for_all_threads": len(set(norms.values())) == 1,
            "per_tensor_fsum_norm": whole,
            "per_tensor_terms_gathered_from_members_equal": math.sqrt(math.fsum(gathered))
            == whole,
            "partial_norms_squared_and_added_equal": math.sqrt(math.fsum(
                x * x for x in partials)) == whole,
            "per_tensor_fsum_norm_equals_flat_float32": float(
                torch.tensor(whole, dtype=torch.float32)) == norms[threads]}


def check_alignment(device: str) -> dict[str, bool]:
    """6: linear forward/backward with the weight at an unaligned address (a view at offset 1
    into a flat buffer) against the weight in its own allocation."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(8, 96, 257, generator=gen).to(device)
    w = torch.randn(515, 257, generator=gen).to(device)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        xs, ws = x.to(dtype), w.to(dtype)
        flat = torch.empty(ws.numel() + 1, dtype=dtype, device=device)
        shifted = flat[1:].view_as(ws).copy_(ws)
        results = []
        for weight in (ws.clone(), shifted):
            weight.requires_grad_(True)
            xi = xs.clone().requires_grad_(True)
            y = F.linear(xi, weight)
            y.float().square().sum().backward()
            results.append((y.detach(), weight.grad, xi.grad))
        out[str(dtype).removeprefix("torch.")] = all(
            torch.equal(a, b) for a, b in zip(*results, strict=True))
    return out


def _full_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    state = {f"model.t{i}": torch.randn(10 + i, generator=gen) for i in range(6)}
    state.update({f"optimizer.t{i}.exp_avg": torch.randn(10 + i, generator=gen)
                  for i in range(6)})
    return state


def _save_owned(rank: int, world: int, path: str, port: int) -> None:
    """A member: save the whole tensors it owns (t_i with i % world == rank, and t0 on all)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    owned = {k: v for k, v in _full_state().items()
             if int(k.split(".")[1][1:]) % world == rank or ".t0" in k}
    dcp.save(owned, checkpoint_id=path)
    dist.destroy_process_group()


def check_dcp() -> dict[str, object]:
    """7: members save their own whole tensors in parallel; one process reads them all."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt")
        mp.spawn(_save_owned, args=(2, path, free_port()), nprocs=2)
        full = _full_state()
        loaded = {k: torch.empty_like(v) for k, v in full.items()}
        dcp.load(loaded, checkpoint_id=path)
        dcp_to_torch_save(path, os.path.join(tmp, "consolidated.pt"))
        consolidated = torch.load(os.path.join(tmp, "consolidated.pt"), weights_only=True)
        return {"files": sorted(os.listdir(path)),
                "loaded_at_world_1_equal": same(list(loaded.values()), list(full.values())),
                "consolidated_equal": consolidated.keys() == full.keys() and all(
                    torch.equal(consolidated[k], full[k]) for k in full)}


def main() -> None:
    torch.manual_seed(0)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    result: dict[str, object] = {"torch": torch.__version__,
                                 "threads": torch.get_num_threads()}
    for device in devices:
        subsets = check_subsets(device)
        for name, r in subsets.items():
            print(f"{device} {name:24s} {r}")
        slices = check_slices(device)
        for name, r in slices.items():
            print(f"{device} {name:24s} unaligned slices equal whole tensors: {r}")
        alignment = check_alignment(device)
        print(f"{device} linear with an unaligned weight equals an aligned one: {alignment}")
        result[device] = {"subsets": subsets, "slices": slices, "alignment": alignment}
    lars = check_lars()
    print(f"cpu LARS over whole tensors split between members equals the whole: {lars}")
    norms = check_norms()
    for key, value in norms.items():
        print(f"cpu norm {key}: {value}")
    checkpoint = check_dcp()
    print(f"cpu distributed checkpoint of owned tensors: {checkpoint}")
    result["dcp"] = checkpoint
    result["lars_subsets_equal_whole"] = lars
    result["norms"] = {k: (v if not isinstance(v, dict) else {str(t): x for t, x in v.items()})
                       for k, v in norms.items()}
    write_result(Path(__file__).resolve().parent / "results" / "shard_exactness.json", result)


if __name__ == "__main__":
    main()
