"""`vsup bench`: apply layouts in turn, load each with vLLM's own benchmark client, compare.

The parts, one job each:

    workload.py  the workload (flags or a `[bench]` table) and the client flags it becomes
    split.py     prompts and request rate split across the serving instances in proportion
    client.py    finding the vLLM interpreter, the client command line, running the clients
    sampler.py   vsup's own telemetry (status polls) during a run, summarised per instance/GPU
    results.py   the clients' figures pooled per layout (throughput, TTFT/TPOT percentiles)
    report.py    the side-by-side table, markdown and the JSON document
    runner.py    the sequence: apply, wait ready, run, record; restore at the end

vsup writes no load generator of its own: the load is `vllm bench serve`'s.
"""
