"""`python -m consumers module:app`: the `bandgate worker` command on its own."""

from consumers.cli import main

main()
