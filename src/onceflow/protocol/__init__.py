"""The protocol: the coordinator and what only its steps use.

`coordinator` is the single home of plan, pre-commit registration, commit, abort and recover. The other
modules are its helpers, one job each: the pure decisions (`decisions`), what the plan step computes
(`planning`), one committer call and its outcome (`committer_calls`), the sweeper (`sweeper`), ownership
and leases of an epoch in flight (`owners`, `leases`), the committed position shown to Kafka's tools
(`positions`), ledger retention as a step (`retaining`), and what the steps return (`step_results`,
`epoch_report`). Code that runs in Spark tasks imports nothing from here.
"""
