"""Subcommands that live in their own module.

Each module defines ``register(sub)`` (an argparse sub-parser with ``set_defaults(run=...)``) and
imports anything heavy inside its run function, so that ``evolve status`` stays fast.
"""
