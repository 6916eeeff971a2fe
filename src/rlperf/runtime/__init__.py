"""A small reference runtime (extra ``runtime``: torch + transformers): one real RL step on the
local device with per-stage timers, and micro-benchmarks that write the device's hardware
profile. The only place in rlperf that imports torch; the core never imports this package."""
