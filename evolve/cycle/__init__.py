"""The fire and its cycles: pure decisions (halt, context budget, entries) and the shell that runs them."""
