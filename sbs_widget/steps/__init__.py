"""Across decode steps and input sets: greedy decoding driven on both sides from one prepared pair
(``decode.py``, the step mapping in ``mapping.py``), the first diverging step in a closed and an open
loop, ties told from bugs, and the lockstep run with culprits at any step."""
