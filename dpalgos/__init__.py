"""The mathematics of the release pipeline: pure numpy/scipy, no I/O, no orchestration.

One module per method: `domain` (scaling, L1-ball projection), `mechanisms` (noise), `accounting`
(dp_accounting composition), `dpkmeans` (Lee & Kifer Algorithm 1), `metrics` (internal evaluation).
"""
