"""`make bench`: gpufed's benchmarks. Each part measures one path against a baseline in the same run.

Owns nothing itself: `bench.__main__` is the command line, one module per part (`bench.offload`),
`bench.procstat` samples processes from /proc, `bench.report` writes bench/results/*.json and
docs/benchmarks.md. Benchmarks measure and report; they are never timed tests and never fail on a
missed target (the report says it was missed).
"""
