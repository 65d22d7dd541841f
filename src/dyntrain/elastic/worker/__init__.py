"""The worker's side of the protocol: its channel to the coordinator, the address it gives its
peers, what it does when declared dead, and its writes to the run folder."""
