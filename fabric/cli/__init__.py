"""The ``fabric`` command line: one module per command group (``*_cmd.py``)."""
