"""Benchmarks that print figures (tests never time anything). Run them from the repository root as
modules: `python -m bench.perf.transport`, `python -m bench.studies.real_model`, `python -m
bench.drills.drill`; `python -m bench.results` runs the throughput sections and renders the pages.

    perf/      throughput and memory of one part: generation, learner, transport, weight sync, ...
    studies/   questions about the recipe and the system, answered by runs: learning, staleness,
               the TRL peer, the planner against reality, the real model, ...
    drills/    faults on purpose: kill -9 each service, the elastic fleet, the protocol fuzzer, the
               verifier's hostile inputs
    report.py  shared statistics and formatting (interleaved repeats, medians, paired ratios, tables)
    workload.py  the workload the benchmarks share (the embedded tiny-cpu recipe)
    results.py   docs/RESULTS.md and the pages under docs/results/
"""
