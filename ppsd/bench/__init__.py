"""Benchmarks of PPSD against EESD, AR and Hugging Face `generate()`.

Two commands: `python -m ppsd bench` (`sweep`: a sweep of settings on one device, with the
projected K-worker clock) and `python -m ppsd bench-pipeline` (`pipeline`: AR and PPSD measured
on real K-worker processes). Below them, each module has one job: `settings` the sweep's points,
`prompts` the inputs, `baselines` the Hugging Face references, `run` the measuring, `stats`
the speeds and ideal speedups, `rows` the per-setting results, `machine` the record of the
machine, and `report` the writers. Nothing is imported here: a subcommand loads what it uses.
"""
