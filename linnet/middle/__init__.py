"""The middle: a checked program to one backend-neutral IR (instantiate, lower, ir, optimise)."""
