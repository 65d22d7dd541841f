"""The ``dyntrain`` command line, one module per command group."""
