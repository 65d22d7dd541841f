"""Run folders, the records they keep and the checkpoints in them: where a run lives (a folder or
an object store), its settings, its line files and their rows, progress and TensorBoard mirrors,
whole-file and DCP checkpoints."""
