"""Work sources (harvested queue, beads, goals, generators) behind one interface, and the ladder."""
