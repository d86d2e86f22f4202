"""`make diagram`: the pictures in docs/, drawn from the synthesized app (see __main__.py)."""
