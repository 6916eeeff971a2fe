"""A request's status in the rollout engine's book, as the int the compiled loops store.

:mod:`rlperf.stages.rollout_engine` keeps them per request; :mod:`rlperf.stages.rollout_loop`
reads and writes the same ints on arrays. Their own module so that the loops' sources
(:data:`rlperf.stages.jit.LOOP_SOURCES`) import nothing else of rlperf: setup.py compiles
them in a build environment without rlperf's dependencies.
"""

WAITING, PREFILL, DECODING, DONE = 0, 1, 2, 3
