"""``python -m hypermedia.cli``: what ``up`` starts its head with, and what tests and
scripts run where the console script is not installed."""

from hypermedia.cli import main

main()
