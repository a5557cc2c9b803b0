"""Clients' telemetry (``POST /v1/events``): what each graph lookup found, what it
cost, why a miss missed, and the client's fall-back counters.

``schema`` validates a batch strictly, ``counters`` bounds the counter names metrics
label by, and ``ingest`` turns a batch into stored events, metrics and the program
map's miss notes. Reports and explanations read the stored events from the index.
"""
