"""What test modules share, imported as ``support.<module>``: no test module imports
another test module or a conftest (docs/development.md lists the modules).

* ``services``: the real services tests start on loopback ports (``redis_server``,
  moto's ``s3_endpoint`` and ``s3_bucket``), fixtures for the whole suite.
* ``backends``: the storage backends a test runs against, chosen with ``--backend``,
  and the shared ``stores`` and ``any_index`` fixtures; ``indexes``: the index
  contract's fixtures and records.
* ``api``, ``served``: requests on the server's API, in process and over HTTP;
  ``served.Server`` is the one ``neffcache serve`` process every suite starts.
* ``e2e``: the black-box harness of the suites that drive the client as processes.
* ``http_stubs``: small HTTP servers in a thread that answer as a test scripts them.
* ``daemons``: the shim's hit daemons a test (or benchmark) started, found and stopped.
* ``client_units``, ``lease_hosts``, ``e2e_fixtures``, ``recovery``, ``browser``,
  ``cli_server``, ``bridge_server``: what one suite's modules share.
"""
