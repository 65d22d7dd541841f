"""Local launching: the coordinator, local worker processes and injected membership events."""
