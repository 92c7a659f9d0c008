"""The K-process pipeline: one worker process per stage over torch.distributed. `pipeline` is where
the runtime's stages run (`Workers`: stage 1 in the caller's process) and the runtime on it
(`DistributedExecutor`), `worker` one stage in its own process, `wire` what they say to each
other, `placement` where each stage runs and what it holds, `processes` and `spawner` the
workers' lives, and `pool` the process's one shared pipeline, what callers use.

Boundary: running stages across processes; the schedule is the runtime's, and nothing here
decides what to decode. Importing this package imports nothing else: its modules bring
torch.distributed, so callers import them when they want worker processes.
"""
