"""onceflow's benchmarks: `python -m bench.run` (or `make bench`) writes bench/report.md, .json and .png."""
