"""One optimizer step over a fixed global batch: which worker computes which chunks, the sampler,
the stepper and what it reduces, clipping, the noise scale, validation, the step's record, and the
canary that proves a worker computes the job's bits."""
