"""The detached actors of one service's Ray namespace, found by name: how the Ray executor finds
its workers again after a restart (``adopt``, ``find``, ``sweep``) and ends their actors."""

from __future__ import annotations

from dyntrain.service.executors.ray_worker import CALL_S, first_line

PREFIX = "dyntrain:"  # every worker actor's name starts so (``ray_nodes.actor_name``)


class ActorDirectory:
    """The worker actors in ``namespace``; ``ray``: the ``ray`` module."""

    def __init__(self, ray, namespace: str) -> None:
        self._ray, self.namespace = ray, namespace

    def get(self, name: str):
        """The actor called ``name``, None when there is none."""
        try:
            return self._ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            return None

    def status(self, name: str):
        """``(actor, status)`` of the actor called ``name``; ``(None, why)`` when it is gone."""
        actor = self.get(name)
        if actor is None:
            return None, f"its Ray actor {name} is gone (its node died while the service was down?)"
        try:
            return actor, self._ray.get(actor.status.remote(), timeout=CALL_S)
        except Exception as exc:
            return None, f"its Ray actor {name} does not answer: {first_line(exc)}"

    def names(self) -> list[str]:
        """The names of the worker actors in the namespace, running or not."""
        return [a["name"] for a in self._ray.util.list_named_actors(all_namespaces=True)
                if a.get("namespace") == self.namespace and a["name"].startswith(PREFIX)]

    def kill(self, actor) -> None:
        """End the actor (and its command) now."""
        try:
            self._ray.kill(actor, no_restart=True)
        except Exception:
            pass

    def discard(self, actor) -> None:
        """Let the actor end its command and itself; killed when it cannot be asked."""
        try:
            actor.discard.remote()
        except Exception:
            self.kill(actor)
