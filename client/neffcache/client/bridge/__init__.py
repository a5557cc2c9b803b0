"""The bridge between stock Neuron caches and a neffcache server (docs/bridge.md).

``neffcache import`` reads a stock cache (a directory or ``s3://bucket/prefix``,
docs/neuron-sdk.md#entry-layout and #s3-backend) and publishes each successful entry to
a server; ``neffcache export`` writes a server's entries back out as a stock cache the
unmodified SDK can read.

* ``stock.py``: find the entries of a stock layout and tell their states apart;
* ``remote.py``: the server's HTTP API as the bridge uses it (the client's own HTTP;
  trouble raised, not a miss: a person runs these commands);
* ``s3.py``: boto3 for an ``s3://`` source, imported only for one (the ``s3`` extra);
* ``importer.py``, ``exporter.py``: the two directions, counted by outcome;
* ``cli.py``: the two commands, which ``neffcache.client.cli`` registers. Importing it
  costs nothing heavy (no boto3, nothing of the server).
"""
