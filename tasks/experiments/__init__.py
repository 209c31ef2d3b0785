"""Paper-reproduction experiments: plain functions that sweep epsilon over methods and return tables
(the flows in `flows.experiments` run them as Prefect tasks and plot them; benchmarks reuse them)."""
