"""`python -m bandgate.consumers module:app`: the `bandgate worker` command on its own."""

from bandgate.consumers.cli import main

main()
