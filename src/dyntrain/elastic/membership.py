"""Pure: the next generation's membership from who is ready, who joined and what is on disk."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dyntrain.elastic.protocol import Generation


def next_generation(
    number: int,
    previous_members: Sequence[str],
    ready: Mapping[str, int | None],
    joiners: Sequence[str],
    min_workers: int,
    max_workers: int,
    checkpoint: tuple[int, str] | None,
) -> Generation | None:
    """Decide generation ``number``, or None while there are fewer than ``min_workers``.

    ``ready`` maps each worker that can take part to the last step it applied (None: it holds no
    state). Survivors keep their relative rank order and come first; joiners are admitted in
    arrival order up to ``max_workers``. The new generation starts from the most advanced state any
    survivor holds, so an interrupted step is recomputed and no applied step is applied twice.
    """
    survivors = [w for w in previous_members if w in ready]
    survivors += [w for w in ready if w not in survivors and w not in joiners]
    admitted = [w for w in joiners if w not in survivors][: max(0, max_workers - len(survivors))]
    members = (survivors + admitted)[:max_workers]
    if len(members) < min_workers or not members:
        return None
    steps = {w: ready.get(w) for w in members}
    holders = [w for w in members if steps[w] is not None]
    if holders:
        best = max(steps[w] for w in holders)
        source = next(w for w in holders if steps[w] == best)
        receivers = tuple(w for w in members if steps[w] != best)
        return Generation(number, tuple(members), best, source=source, receivers=receivers)
    if checkpoint is not None:
        step, path = checkpoint
        return Generation(number, tuple(members), step, checkpoint=path)
    return Generation(
        number, tuple(members), 0, source=members[0], receivers=tuple(members[1:]), fresh=True
    )
