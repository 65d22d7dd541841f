"""The coordinator's side: who is in the job, generations formed and failed, the changes they
make, and the coordinator's reads and writes of its store."""
