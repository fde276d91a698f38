"""`python -m tessera ...` is the `tessera` command."""

from ._cli import main

main()
