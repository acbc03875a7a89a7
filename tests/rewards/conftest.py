"""The reward tests' server: ``served(scorer, port=0)`` starts ``fourfold serve-reward``'s server of
``scorer`` on 127.0.0.1 (no batching window: each request scored as it comes) and answers
``(server, URL)``; every server a test started is shut down after it."""

import pytest

from fourfold.apps.reward_server import start_server


@pytest.fixture
def served():
    servers = []

    def serve(scorer, port=0):
        server = start_server(scorer, port=port, window_s=0.0)
        servers.append(server)
        return server, f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
    for s in servers:
        s.shutdown()
        s.server_close()
