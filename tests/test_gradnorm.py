"""The global norm of clipping (``dyntrain.elastic.step.gradnorm``): per-tensor float64 terms that
do not depend on where a gradient lies in the flat buffer, summed exactly in any order, and a clip
whose bits do not depend on how the buffer is cut."""

import itertools
import math
import random

import torch

from dyntrain.elastic.step.gradnorm import (
    clip_to_norm_,
    global_norm,
    sum_of_squares,
    tensor_squares,
)


def _grads(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # awkward sizes (vector bodies and tails), magnitudes apart so that rounding shows
    return [torch.randn(n, generator=gen) * scale
            for n, scale in ((1, 3.0), (7, 1e-3), (4099, 1.0), (33, 1e4), (1000, 0.5))]


def test_a_term_is_the_same_wherever_the_gradient_lies():
    g = _grads()[2]
    expected = sum_of_squares(g.clone())
    assert expected.dtype == torch.float64
    assert math.isclose(float(expected), math.fsum(x * x for x in g.double().tolist()),
                        rel_tol=1e-13)
    for offset in range(0, 19):  # every alignment of a float32 within 64 bytes, and more
        flat = torch.full((offset + g.numel() + 5,), 7.0)
        flat[offset : offset + g.numel()] = g
        got = sum_of_squares(flat[offset : offset + g.numel()])
        assert got.item() == expected.item(), offset
    # a non-contiguous view of the same numbers (a channels_last gradient) gives them too
    square = torch.randn(3, 4, 5, 6)
    assert sum_of_squares(square.to(memory_format=torch.channels_last)).item() == \
        sum_of_squares(square.contiguous()).item()


def test_the_terms_do_not_depend_on_the_buffer_layout():
    grads = _grads()
    numels = [g.numel() for g in grads]
    reference = None
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3]):
        flat, offsets, offset = torch.zeros(sum(numels) + 3), [0] * len(grads), 3
        for t in order:
            offsets[t] = offset
            flat[offset : offset + numels[t]] = grads[t]
            offset += numels[t]
        terms = tensor_squares(flat, offsets, numels)
        assert terms.dtype == torch.float64 and terms.shape == (len(grads),)
        if reference is None:
            reference = terms
        assert torch.equal(terms, reference), order
    # only some tensors (a primary owner's): the others' slots stay zero, and the slots of the
    # members add up to the whole vector exactly
    parts = [tensor_squares(flat, offsets, numels, ts) for ts in ([0, 3], [1], [2, 4])]
    assert parts[1][0] == 0 and torch.equal(sum(parts), reference)


def test_the_norm_is_the_exact_sum_in_any_order():
    terms = [float(sum_of_squares(g)) for g in _grads()]
    norms = {global_norm(list(p)) for p in itertools.permutations(terms)}
    assert norms == {math.sqrt(math.fsum(terms))}
    assert global_norm(torch.tensor(terms, dtype=torch.float64)) == norms.pop()
    # a sum in one float64 order and another can differ: fsum does not
    rng = random.Random(0)
    many = [rng.uniform(0, 1) * 10 ** rng.randint(-8, 8) for _ in range(200)]
    assert len({global_norm(rng.sample(many, len(many))) for _ in range(20)}) == 1


def test_clipping_scales_each_element_alike_however_the_buffer_is_cut():
    grads = _grads()
    flat = torch.cat(grads)
    norm = global_norm(tensor_squares(flat, list(itertools.accumulate(
        [0] + [g.numel() for g in grads[:-1]])), [g.numel() for g in grads]))
    assert norm > 1.0
    whole = flat.clone()
    clip_to_norm_(whole, norm, 1.0)
    pieces = [g.clone() for g in grads]
    for piece in pieces:
        clip_to_norm_(piece, norm, 1.0)
    assert torch.equal(torch.cat(pieces), whole)
    assert math.isclose(float(torch.linalg.vector_norm(whole.double())), 1.0, rel_tol=1e-5)
    small = flat.clone()
    clip_to_norm_(small, norm, 2 * norm)  # under the max: left alone
    assert torch.equal(small, flat)

