"""The REST API of the job service (FastAPI): ``dyntrain.service.api.app.create_api``.

This package imports nothing itself, so that ``dyntrain.service.api.schemas`` (the request
bodies, which the CLI reads to check a YAML file's fields) does not import FastAPI.
"""
