"""Warm workers: Python processes that imported torch already and wait to become one worker.

The local executor's supervisor starts one zygote, ``python -m dyntrain.service.executors.warm
--zygote``, which imports what nearly every training worker imports first (``WARM_IMPORTS``:
torch, torch.optim and torch._dynamo - which the first optimizer imports lazily, over a second
here -, torch.distributed, numpy, dyntrain's ElasticTrainer) once, then forks one warm worker per
request (``serve_forks``; ``warm_pool.py`` has the protocol and the supervisor's side). It never
computes and starts no thread of its own (OpenBLAS's idle pool, which numpy starts, is shut down
around a fork by OpenBLAS's own handler). A forked worker closes the zygote's socket, leads a
session of its own, reseeds numpy's global generator (``random`` reseeds itself at a fork;
workers share the zygote's string-hash seed, as a fork does), prints its own "ready" line and
blocks on its stdin, a pipe whose write end went to the supervisor, for one assignment, a JSON
line ``{"argv", "env", "cwd", "log"}``. (Without ``--zygote`` the module is one warm worker
that imported everything itself.) It becomes that
worker: stdout and stderr appended to the log, stdin from /dev/null, exactly the worker's
environment and working directory, ``sys.argv`` and ``sys.path[0]`` as the interpreter sets
them, and the script (``runpy.run_path``) or module (``runpy.run_module``) runs as
``__main__``. Its exit is the worker's exit: the status, threads and exit handlers of
``python SCRIPT``, without the interpreter's teardown (``dyntrain.mainexit``). It serves that
one worker and never another, so no state passes from one job to the next; it is already the
leader of its own session, so a signal to the worker's process group reaches it and everything
it starts.

Which workers may take one (``eligible``): the command runs this very interpreter (the same
path, not merely the same binary: a virtual environment is its path) as ``python [-u] SCRIPT
...`` or ``python [-u] -m MODULE ...``, and every variable of its environment that was read
before it became that worker equals the warm process's (``read_before_assignment``): what the
interpreter reads when it starts (``PYTHON*``, ``HOME`` for the user's site directory, the
locale), the dynamic loader (``LD_*``), and what the libraries of ``WARM_IMPORTS`` read when
imported (``TORCH*``, ``PYTORCH_*``, ``OMP_*``, ``MKL_*``, ``OPENBLAS_*``, ``KMP_*``, ...).
A worker sets its whole environment before its script runs (``become``), so every other
variable (``PWD``, ``SHLVL``, a user's own) may differ: a job submitted with its submitter's
shell environment still starts warm. The numerics a worker asks for (its thread count and CPU
kernel level: ``LIBRARY_ENV``) are read by torch's libraries when they first compute, which
the zygote never does: a warm worker sets them itself, so a worker that names them may differ
there. Every other worker starts cold, as before.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import shutil
import socket
import sys
import time

from dyntrain.elastic.numerics import LIBRARY_ENV
from dyntrain.mainexit import run_as_main
from dyntrain.service.core.torchrun import ENV_NAMES

WARM_IMPORTS = ("torch", "torch.optim", "torch._dynamo", "torch.distributed", "numpy",
                "dyntrain.elastic.trainer")
# set per worker by the service and the executor; none of them is read at interpreter start-up
# (CUDA_VISIBLE_DEVICES is read when CUDA initialises, which importing torch does not do), nor
# are torchrun's variables (read by the script and init_process_group)
PER_WORKER_PREFIXES = ("DYNTRAIN_", "AWS_BATCH_")
PER_WORKER = frozenset({"CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED", *ENV_NAMES})
# read before a warm process becomes its worker: by the interpreter as it starts, the dynamic
# loader, the C library, and torch, numpy and their math libraries as they are imported
READ_BEFORE_PREFIXES = ("PYTHON", "LD_", "LC_", "MALLOC_", "GLIBC_", "TORCH", "PYTORCH_",
                        "CUDA", "NUMPY_", "OMP_", "GOMP_", "KMP_", "MKL", "OPENBLAS_", "GOTO",
                        "DNNL_", "ONEDNN_", "KINETO_", "NVIDIA_")
READ_BEFORE_NAMES = frozenset({"HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
                               "ATEN_CPU_CAPABILITY"})


def read_before_assignment(name: str) -> bool:
    """Whether a warm process may have read the variable before it took its assignment."""
    return name in READ_BEFORE_NAMES or name.startswith(READ_BEFORE_PREFIXES)


def eligible(argv: list[str], env: dict[str, str], cwd: str | None, base_env: dict[str, str],
             python: str) -> bool:
    """Whether a worker with this command, environment and working directory may run in a warm
    process started as ``python -m dyntrain.service.executors.warm`` with ``base_env``."""
    if len(argv) < 2 or shutil.which(argv[0], path=env.get("PATH", os.defpath)) != python:
        return False
    entry = _entry(argv[1:])
    if entry is None or (entry[0] == "script" and not os.path.isfile(
            os.path.join(cwd or os.getcwd(), entry[1]))):
        return False  # (a missing script: the cold start says so in Python's own words)
    keys = (set(env) | set(base_env)) - PER_WORKER - {k for k in LIBRARY_ENV if k in env}
    return all(env.get(k) == base_env.get(k) for k in keys
               if read_before_assignment(k) and not k.startswith(PER_WORKER_PREFIXES))


def _entry(args: list[str]) -> tuple[str, str, list[str]] | None:
    """``("module", name, rest)`` or ``("script", path, rest)`` for ``[-u] -m M ...`` or
    ``[-u] SCRIPT ...``; None for anything else (``-c``, other options)."""
    if args and args[0] == "-u":
        args = args[1:]
    if len(args) >= 2 and args[0] == "-m" and args[1] and not args[1].startswith("-"):
        return "module", args[1], args[2:]
    if args and args[0] and not args[0].startswith("-"):
        return "script", args[0], args[1:]
    return None


def become(assignment: dict) -> None:
    """Turn this process into the assigned worker and run it (returns when it returns)."""
    log = os.open(assignment["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(null, 0), os.dup2(log, 1), os.dup2(log, 2)
    os.close(log), os.close(null)
    env = assignment["env"]
    if env.get("PYTHONUNBUFFERED") or assignment["argv"][1] == "-u":
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    if assignment.get("cwd"):
        os.chdir(assignment["cwd"])
    os.environ.clear()
    os.environ.update(env)
    _numerics(env)
    kind, target, rest = _entry(assignment["argv"][1:])
    if kind == "module":
        sys.argv, sys.path[0] = [target, *rest], os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *rest]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")


def _numerics(env: dict[str, str]) -> None:
    """What a cold start would have read when torch loaded: the job's numerics (threads,
    deterministic algorithms, matmul precision), or a plain ``OMP_NUM_THREADS``. A torchrun
    gang's worker (``TORCHELASTIC_RUN_ID``) runs a script that knows nothing of the job's
    numerics: only its ``OMP_NUM_THREADS``, as in a new interpreter. The kernel level is read
    from the environment at the first computation, after this."""
    from dyntrain.elastic.numerics import apply, numerics_from_env

    pinned = None if "TORCHELASTIC_RUN_ID" in env else numerics_from_env(env)
    threads = env.get("OMP_NUM_THREADS", "")
    if pinned is not None:
        apply(pinned)
    elif threads.isdigit() and int(threads) > 0:
        sys.modules["torch"].set_num_threads(int(threads))


def serve_forks(imports_s: float) -> bool:
    """Be the zygote: fork one warm worker per request on stdin (a Unix socket to the
    supervisor; ``warm_pool.py`` has the protocol). Returns False when the supervisor let it go,
    True in a forked worker (whose stdin is then its own pipe)."""
    sock = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    print(f"dyntrain warm zygote {os.getpid()} ready: imports took {imports_s:.2f} s", flush=True)
    try:
        sock.send(b"ready")
        while sock.recv(16):
            try:
                pid, stdin_w = _fork_worker(sock)
            except OSError as e:
                sock.send(f"error: cannot fork a warm worker: {e}".encode())
                continue
            if pid == 0:
                return True
            try:
                socket.send_fds(sock, [f"forked {pid}".encode()], [stdin_w])
            finally:
                os.close(stdin_w)  # (the worker, unassigned, exits when the supervisor's goes)
    except OSError:  # the supervisor is gone
        pass
    return False


def _fork_worker(sock: socket.socket) -> tuple[int, int]:
    """Double-fork a warm worker: ``(pid, write end of its stdin)`` here, ``(0, -1)`` in it.
    The intermediate child exits at once, so the worker is re-parented to the nearest child
    subreaper, the supervisor, before the intermediate is reaped here and the pid goes out."""
    sys.stdout.flush(), sys.stderr.flush()
    stdin_r, stdin_w = os.pipe()
    pid_r, pid_w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            worker = os.fork()
            if worker:
                os.write(pid_w, str(worker).encode())
                os._exit(0)
            # the worker: a session of its own, its pipe as stdin, no fd of the zygote's
            for fd in (pid_r, pid_w, stdin_w):
                os.close(fd)
            sock.close()
            os.setsid()
            os.dup2(stdin_r, 0)
            os.close(stdin_r)
            if "numpy" in sys.modules:  # a fresh draw, as a new interpreter's (random reseeds
                sys.modules["numpy"].random.seed()  # itself at a fork; torch's is fixed anyway)
            return 0, -1
        except BaseException:
            os._exit(1)
    os.close(stdin_r), os.close(pid_w)
    with os.fdopen(pid_r, "rb") as said:
        pid = said.read()
    os.waitpid(middle, 0)
    if not pid:
        os.close(stdin_w)
        raise OSError("the intermediate process did not fork")
    return int(pid), stdin_w


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--zygote"]):
        print("usage: python -m dyntrain.service.executors.warm [--zygote]", file=sys.stderr)
        return 2
    started = time.monotonic()
    for name in WARM_IMPORTS:
        importlib.import_module(name)
    took = time.monotonic() - started
    # (to the supervisor's log; benchmarks wait for this line)
    if not args:
        print(f"dyntrain warm worker {os.getpid()} ready: imports took {took:.2f} s", flush=True)
    else:
        zygote = os.getpid()
        if not serve_forks(took):
            return 0
        print(f"dyntrain warm worker {os.getpid()} ready: forked by zygote {zygote}, whose "
              f"imports took {took:.2f} s", flush=True)
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return 0  # let go unused (the supervisor stopped)
    # the exit status, threads and exit handlers of `python SCRIPT`, without its teardown: a
    # worker that left its job frees its slot at once (dyntrain.mainexit)
    run_as_main(lambda: become(json.loads(line)))


if __name__ == "__main__":
    sys.exit(main())
