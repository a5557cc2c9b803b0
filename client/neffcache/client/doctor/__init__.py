"""``neffcache doctor``: whether each interception point works on this host, and what
differs from what neffcache assumes about the Neuron SDK (docs/doctor.md).

One module per group of checks (``config_checks``, ``server_checks``, ``path_checks``
with ``daemon_checks``, ``stack_checks``, ``hook_checks``, ``l1_checks``, and
``live_checks``, which runs only with ``--live``), each exporting ``CHECKS``; the
facts they share (the configuration, the server's status, the interpreters' probes)
are gathered once, lazily, by ``context.Context``; ``runner`` runs the registry,
``render`` prints the results and ``report`` writes the file a user attaches to an
issue. The live checks' runs: ``live_run`` (a child process per run), ``live_child``
(the child), ``live_drivers`` (the real stacks' tiny compiles), ``live_facts`` (what
a run showed).

Nothing here is imported by a training job: only the ``neffcache doctor`` command.
"""

from __future__ import annotations
