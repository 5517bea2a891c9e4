"""Another OS process with its own leave cache, driven line by line on stdin.

    gate ID...   sync the fence, answer which of the ids are gated, and the cache's state
    leave ID     make ID leave through the service, from this process
    rejoin ID    make ID rejoin
Each answer is one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys

import django

django.setup()

from community.cache import leave_cache, leave_gate  # noqa: E402
from community.services.layer import leave_community_layer, rejoin_community_layer  # noqa: E402


def main() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        ids = [int(a) for a in args]
        if command == "gate":
            gate = leave_gate()
            cache = leave_cache
            answer = {
                "left": [u for u in ids if gate.is_left(u)],
                "version": gate.version,
                "generation": gate.generation,
                "warms": cache.warms,
            }
        elif command == "leave":
            answer = {"status": int(leave_community_layer(user_id=ids[0]).membership.status)}
        elif command == "rejoin":
            answer = {"status": int(rejoin_community_layer(user_id=ids[0]).membership.status)}
        else:
            answer = {"error": f"unknown command {command}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
