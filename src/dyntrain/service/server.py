"""The service process, as ``dyntrain server`` runs it (``Service``, ``ServiceConfig``: see
``dyntrain.service.engine.service``)."""

from dyntrain.service.engine.service import DEFAULT_PORT, Service, ServiceConfig, is_loopback

__all__ = ["DEFAULT_PORT", "Service", "ServiceConfig", "is_loopback"]
