"""Mixed-speed workers: a faster member gets more chunks, planned from measured chunk times.

Each member smooths its own seconds per chunk (an exponential moving average over the steps it
computed chunks in) and writes it into its slot of the step's tail, so after the step's sum every
member holds every member's time and plans alike (``chunks.balance_counts``). The plan decided
after step s is used from step s + 2 on: the chunks of the next step are always known a whole
step ahead (a prefetching loader can follow them). A new plan is taken only when it promises a
step at least ``margin`` shorter than the current one, so noise does not shuffle chunks around.
Chunks are the unit of work, so the result is bitwise the same whatever the plan.
"""

from __future__ import annotations

from dyntrain.elastic.step.chunks import assign_chunks, balance_counts, blocks, step_seconds


class ChunkBalancer:
    """The chunk plan of one generation, step by step."""

    def __init__(self, num_chunks: int, world_size: int, start_step: int, enabled: bool = True,
                 smoothing: float = 0.3, margin: float = 0.1) -> None:
        self.num_chunks, self.world_size, self.enabled = num_chunks, world_size, enabled
        self.smoothing, self.margin = smoothing, margin
        even = [len(b) for b in assign_chunks(num_chunks, world_size)]
        self._counts = {start_step: even, start_step + 1: even}
        self._own = 0.0  # this member's smoothed seconds per chunk; 0: not measured yet
        self.replans = 0

    @property
    def slots(self) -> int:
        """How many numbers the step's tail carries for the balancer (one per member)."""
        return self.world_size if self.enabled else 0

    def counts(self, step: int) -> list[int]:
        return self._counts[step]

    def plan(self, step: int) -> list[range]:
        """Every member's chunks in ``step`` (known for the current step and the next)."""
        return blocks(self._counts[step])

    def measured(self, seconds: float, chunks: int) -> float:
        """Fold in this member's time for ``chunks`` chunks; returns its smoothed time."""
        if chunks > 0:
            per_chunk = seconds / chunks
            self._own = per_chunk if self._own == 0 else (
                self.smoothing * per_chunk + (1 - self.smoothing) * self._own)
        return self._own

    def observe(self, step: int, seconds_per_chunk: list[float]) -> None:
        """Step ``step`` is done and every member's smoothed time is known: plan step + 2."""
        current = self._counts[step + 1]
        chosen = current
        if self.enabled and all(t > 0 for t in seconds_per_chunk):
            proposal = balance_counts(self.num_chunks, seconds_per_chunk)
            if step_seconds(proposal, seconds_per_chunk) < (1 - self.margin) * step_seconds(
                    current, seconds_per_chunk):
                chosen = proposal
                self.replans += 1
        self._counts[step + 2] = chosen
        self._counts.pop(step, None)
