"""The elastic runtime: membership, plans, state transfer, checkpoints and the step loop."""
