"""fakeredis (with its Lua engine) serving the Redis protocol on a loopback port: what
the Redis suites run against on a machine without a ``redis-server`` binary, outside
CI (``redis_service`` in loopback.py). Run as a script: ``fake_redis_server.py PORT``.
"""

from __future__ import annotations

import sys

from fakeredis import TcpFakeServer


def main(port: int) -> None:
    server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]))
