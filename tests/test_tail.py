"""The tail of a step's reduced buffer as a named layout: each part at its offset, the same on
every worker, read back in one piece."""

from __future__ import annotations

import torch

from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.collective.tail import SCALARS, TailLayout, set_flags
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.step.stepper import TAIL, ChunkStepper
from test_stepper import dataset, loss_fn, make_worker

CPU = torch.device("cpu")


def test_every_part_has_its_offset_in_buffer_order():
    layout = TailLayout(bn_numel=12, norms=4, slots=2)
    assert (layout.bn, layout.norm_slots, layout.caller_slots) == (
        slice(0, 12), slice(12, 16), slice(16, 18))
    assert (layout.loss, layout.reform, layout.leave, layout.checkpoint, layout.size) == (
        18, 19, 20, 21, 22)
    plain = TailLayout(bn_numel=12)
    assert plain.norm_slots == slice(12, 12) and plain.caller_slots == slice(12, 12)
    assert (plain.loss, plain.size) == (12, 16)
    assert TAIL == len(SCALARS) == 4


def test_the_layout_of_a_tail_is_known_from_its_size():
    assert TailLayout.of_size(22, 12, 4, slots=2) == TailLayout(12, 4, 2)
    assert TailLayout.of_size(18, 12, 4, slots=2) == TailLayout(12, 0, 2)


def test_a_summed_tail_is_read_by_name():
    layout = TailLayout(bn_numel=3, norms=2, slots=2)
    tail = torch.arange(layout.size, dtype=torch.float64)
    tail[layout.loss] = 1.5
    set_flags(tail, reform=True, leave=True)
    tail[layout.leave] = 2.0  # two members leave: their flags were added up
    values = layout.read(tail)
    assert values.norms == [3.0, 4.0] and values.slots == [5.0, 6.0]
    assert (values.loss, values.reform, values.leavers) == (1.5, True, 2)
    assert not values.checkpoint
    set_flags(tail, reform=False, leave=False)
    assert not layout.read(tail).reform and layout.read(tail).leavers == 0
    assert values.squares == []
    set_flags(tail, reform=False, leave=False, checkpoint=True)  # the leader's clock: due
    assert layout.read(tail).checkpoint and not layout.read(tail).reform


def test_the_norm_terms_lie_after_the_callers_slots():
    """Levels 2-3 with clipping: one slot per tensor, each filled by its primary owner."""
    layout = TailLayout(bn_numel=3, norms=0, slots=2, squares=4)
    assert (layout.caller_slots, layout.square_slots) == (slice(3, 5), slice(5, 9))
    assert (layout.loss, layout.size) == (9, 13)
    tail = torch.zeros(layout.size, dtype=torch.float64)
    tail[layout.caller_slots] = torch.tensor([7.0, 8.0])
    tail[layout.square_slots] = torch.tensor([0.25, 1e-30, 0.0, 3e7], dtype=torch.float64)
    tail[layout.loss] = 2.5
    values = layout.read(tail)
    assert values.slots == [7.0, 8.0] and values.squares == [0.25, 1e-30, 0.0, 3e7]
    assert values.loss == 2.5 and values.norms == []


def test_the_stepper_builds_the_tail_it_reads():
    """With the noise scale measured and the balancer's slots: this worker's loss, its flags
    and its slot land where the layout says, and come back in the step's result."""
    config = TrainConfig(global_batch=40, chunk_size=5, noise_scale=True, noise_every=1)
    stepper = ChunkStepper(config, make_worker(), dataset(), loss_fn, CPU)
    k = config.num_chunks
    red = stepper.start(0, range(k), Group(None, 0, 1, CPU), slots=2)
    layout = red.layout
    assert layout == TailLayout(stepper.bn.width * k, k, 2)
    assert red.meta.numel() == layout.size
    assert bool((red.meta[layout.norm_slots] > 0).all())  # every chunk's norm: all are mine
    loss = red.meta[layout.loss].item()
    result = stepper.finish(red, reform=True, leave=False, should_abort=lambda: False,
                            slot=(1, 0.5))
    assert result.slots == [0.0, 0.5] and result.reform and result.leavers == 0
    assert result.loss == loss and result.noise is not None
    unmeasured = ChunkStepper(TrainConfig(global_batch=40, chunk_size=5), make_worker(),
                              dataset(), loss_fn, CPU)
    red = unmeasured.start(0, range(k), Group(None, 0, 1, CPU))
    assert red.layout == TailLayout(unmeasured.bn.width * k) and \
        red.meta.numel() == red.layout.size
