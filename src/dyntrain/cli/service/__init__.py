"""``dyntrain server`` and the commands that talk to it.

``server`` runs the job service in the foreground; ``submit``, ``status``, ``logs``, ``cancel``,
``terminate`` and the ``ce``, ``queue``, ``jobdef`` and ``policy`` groups are thin clients of
its REST API.
Every client command takes ``--url`` and ``--token`` (on the command, or on its group), which
default to ``$DYNTRAIN_URL`` (else http://127.0.0.1:8642; several replicas' URLs separated by
commas) and ``$DYNTRAIN_TOKEN``. One module per
command or group: ``server``, ``submit``, ``follow`` (logs), ``jobs`` (status, cancel,
terminate), ``compute`` (ce), ``queues``, ``definitions`` (jobdef), ``policies`` (policy).
"""

from dyntrain.cli.service.compute import ce
from dyntrain.cli.service.definitions import jobdef
from dyntrain.cli.service.follow import logs
from dyntrain.cli.service.jobs import cancel, status, terminate
from dyntrain.cli.service.policies import policy
from dyntrain.cli.service.queues import queue
from dyntrain.cli.service.server import server
from dyntrain.cli.service.submit import submit

COMMANDS = (server, submit, status, logs, cancel, terminate, ce, queue, jobdef, policy)
