"""The K-process pipeline: one worker process per stage over torch.distributed. `pipeline` holds
the coordinator (`DistributedExecutor`, rank 0, stage 1 in the caller's process), `worker` one
stage in its own process, `wire` what they say to each other, `placement` where each stage runs
and what it holds, `processes` the workers' lives, and `pool` the process's one shared pipeline,
what callers use.

Boundary: executing the schedule (`ppsd.executors.schedule`) across processes; nothing here
decides what to decode. Importing this package imports nothing else: its modules bring
torch.distributed, so callers import them when they want worker processes.
"""
