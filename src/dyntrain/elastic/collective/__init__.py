"""Process groups per generation and the exact reductions over them: the float64 ring, bucketed
gradient reduction, the reduced buffer's tail, reachability probes, and the state hand-over to
joiners."""
