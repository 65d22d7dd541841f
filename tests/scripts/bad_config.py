"""A user script whose TrainConfig is invalid: it must end in one line, exit status 2.

ARGV[1], when given: the TrainConfig's keyword arguments as JSON (default: a global batch that
chunk_size does not divide)."""

import json
import sys

from dyntrain import TrainConfig

TrainConfig(**(json.loads(sys.argv[1]) if len(sys.argv) > 1 else
               {"global_batch": 30, "chunk_size": 8}))
