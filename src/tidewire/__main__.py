"""``python -m tidewire``: the ``tidewire`` command."""

from tidewire.cli import main

main()
