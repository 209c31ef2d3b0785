"""The mathematics of the release pipeline: numpy/scipy (and OpenDP's samplers), no I/O, no orchestration.

One module per method, with its mechanism plan: `dpkmeans` (Lee & Kifer Algorithm 1), `leekifer` (their
postprocessing), `admm` / `hierarchy` / `contingency` / `matrix_mechanism` (Lee, Wang & Kifer), `kernel_kmeans`,
`dpsgd`, `generative`, `dpgm` (Acs et al.). Shared: `plan` (mechanism plans), `noise` (exact samplers),
`accounting` (dp_accounting composition), `domain` (scaling, L1-ball projection), `metrics`, `counting`,
`baselines` and `mechanisms` (seeded simulation noise for the experiments' baselines only).
"""
