"""`python -m fleet.cli.kfleet`: the kfleet console script."""

from fleet.cli.kfleet import main

main()
