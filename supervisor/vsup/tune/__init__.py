"""`vsup tune`: search a space of layouts derived from a base layout for the one that serves
the most under a latency SLO on this node, with vLLM's own client, reusing `vsup bench`.

- space.py: the candidates (the base layout's knobs varied; `[tune]` overrides the defaults)
  and their pruning by validation and the planner before anything starts.
- slo.py: the SLO (`ttft_p99<=2s,tpot_p99<=100ms`) and goodput.
- search.py: asynchronous successive halving over rungs of prompts, each candidate started once.
- measure.py: one rung of one candidate through the bench's runner, with goodput and energy.
- pareto.py: the throughput/latency front.
- report.py: the table, the JSON, markdown, the plots and the chosen layout's file.
"""
