"""``python -m peloton.cli``: the same as the ``peloton`` command."""

from peloton.cli.main import main

main()
