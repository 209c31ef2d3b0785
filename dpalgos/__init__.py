"""The mathematics of the release pipeline: numpy/scipy/numba (and OpenDP's samplers, dp_accounting), no I/O, no
orchestration; it imports nothing of the project outside itself.

One module per method: `dpkmeans` and `lloyd` (Lee & Kifer Algorithm 1), `leekifer` (their postprocessing),
`admm` / `hierarchy` / `contingency` / `matrix_mechanism` (Lee, Wang & Kifer), `hdmm` (HDMM's range strategy),
`kernel_kmeans`, `dpsgd`, `generative`, `dpgm` (Acs et al.), `friendlycore` (Tsfadia et al.) and `coinpress` (a
baseline of it). Shared: `plan` (mechanism plans), `noise` (exact samplers), `accounting` (dp_accounting
composition), `intervals` (noise laws and bootstrap intervals), `domain` (scaling, projections), `metrics`,
`counting`, `arrays`, `lazy` (heavy modules imported on first use), `baselines` and `mechanisms` (seeded simulation
noise for the experiments' baselines only). Start with `plan`, then `noise`; every module is in the table of
docs/explanation/architecture.md.
"""
