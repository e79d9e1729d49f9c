"""Every git decision and every git process evolve starts, in one room (docs/DESIGN.md §8).

``run`` starts git (no hooks, pinned programs, literal pathspecs, an allow-listed environment,
bounded); ``pins`` decides what the repository's own config may not choose, ``trust`` and
``approve`` hold the operator's approved filters and ``filters`` refuses plaintext for a filtered
path; ``refs`` reads and moves refs by compare-and-swap; ``change`` is what a cycle changed in a
tree and how it is committed, saved or undone; ``worktree`` is the agent's own worktree; ``land``
is the landing decision (pure) and ``landing`` applies it; ``gitdir`` reads a checkout's state
without git; ``patch`` applies a model's diff; ``toplevel`` finds the repository without starting
git. Nothing here is imported by this package itself, so ``evolve status`` pays only for what it uses.
"""
