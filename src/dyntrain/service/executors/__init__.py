"""Executors: where the worker processes of jobs run (``local``: this machine; ``ray``: a Ray
cluster), each an implementation of ``dyntrain.service.core.executor.Executor``."""
