"""The math grader's stages, one module each. `rlvr.rewards.grader` is the public entry and its
docstring is the map (which tier lives where, in order); import from there, not from here."""
