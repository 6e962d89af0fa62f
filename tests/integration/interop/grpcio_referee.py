"""An independent gRPC implementation (grpcio, gRPC C-core) as the referee of backstop's
service-config client: a scripted server, and grpcio's own client with the same JSON.

    python3 grpcio_referee.py grpcio   # grpcio's client against the scripted server: JSON
    python3 grpcio_referee.py serve    # the scripted server alone: prints "PORT n", then,
                                       # once stdin closes, the JSON of what it saw
    python3 grpcio_referee.py deadline # grpcio's client calls SLOW once with a 0.3 s
                                       # deadline: JSON of when the call ended, its status
                                       # and what the server was told was left

Each method's one call meets the statuses of SCRIPT in order, one per attempt. The JSON
gives, per method: the attempts the server saw, the final status the server sent, the gaps
between attempts (ms) and each attempt's grpc-previous-rpc-attempts.
SLOW (a single-attempt method whose config entry says "timeout": "0.3s") never answers in
time: the server records what it was told was left (`time_remaining()` on arrival, in ms) and
holds the call for up to a second; it appears in the JSON only once called. grpcio's client
calls it with a per-call timeout of 0.3 s, not from the config: on the Firecracker VMs this
suite runs on, grpcio 1.68's deadline from a service config's "timeout" comes out wrong (the
call fails at once with DEADLINE_EXCEEDED before reaching the server; "2s" fails after
~0.86 s, "5s" is ignored), while a per-call timeout behaves. Both are the same 0.3 s deadline.
Loopback only (127.0.0.1), bounded: five calls, a few seconds.
"""

import json
import os
import sys
import threading
import time
from concurrent import futures

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = open(os.path.join(HERE, "service_config.json")).read()

# Per method, the status of each successive attempt (then OK).
SCRIPT = {
    "/pkg.Billing/GetBalance": ["UNAVAILABLE", "UNAVAILABLE", "OK"],
    "/pkg.Billing/Charge": ["UNAVAILABLE", "OK"],
    "/pkg.Ledger/Read": ["UNAVAILABLE", "UNAVAILABLE", "OK"],
    "/pkg.Ledger/Audit": ["INTERNAL", "OK"],
    "/other.Svc/Ping": ["UNAVAILABLE", "OK"],
    "/pkg.Search/Find": ["UNAVAILABLE", "OK"],
}


# A single-attempt method with "timeout": "0.3s" in the config, whose server never answers
# in time.
SLOW = "/pkg.Slow/Wait"


class Scripted(grpc.GenericRpcHandler):
    def __init__(self):
        self.lock = threading.Lock()
        self.seen = {m: [] for m in SCRIPT}
        self.told = []  # SLOW: the ms left by the deadline the server was told, per call

    def service(self, details):
        method = details.method
        if method == SLOW:

            def hold(request, context):
                left = context.time_remaining()
                with self.lock:
                    self.told.append(None if left is None else round(left * 1000, 1))
                end = time.monotonic() + 1.0
                while context.is_active() and time.monotonic() < end:
                    time.sleep(0.005)
                return b""

            return grpc.unary_unary_rpc_method_handler(hold)
        if method not in SCRIPT:
            return None

        def handle(request, context):
            meta = dict(context.invocation_metadata())
            with self.lock:
                attempt = len(self.seen[method])
                self.seen[method].append(
                    (time.monotonic(), meta.get("grpc-previous-rpc-attempts"))
                )
            codes = SCRIPT[method]
            code = codes[attempt] if attempt < len(codes) else "OK"
            if code != "OK":
                context.abort(getattr(grpc.StatusCode, code), "scripted")
            return b""

        return grpc.unary_unary_rpc_method_handler(handle)

    def report(self, finals):
        out = {}
        for method, seen in self.seen.items():
            times = [t for t, _ in seen]
            out[method] = {
                "attempts": len(seen),
                "status": finals.get(method),
                "gaps_ms": [round((b - a) * 1000, 1) for a, b in zip(times, times[1:])],
                "previous": [p for _, p in seen],
            }
        if self.told:
            out[SLOW] = {"told_ms": self.told}
        return out

    def final_statuses(self):
        """The status the server sent last, per method (what a caller ends with)."""
        finals = {}
        for method, seen in self.seen.items():
            if seen:
                codes = SCRIPT[method]
                last = len(seen) - 1
                finals[method] = codes[last] if last < len(codes) else "OK"
        return finals


def start():
    scripted = Scripted()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((scripted,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, scripted, port


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "grpcio"
    server, scripted, port = start()
    if mode == "serve":
        print(f"PORT {port}", flush=True)
        sys.stdin.read()  # until the caller closes it
    elif mode == "deadline":
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=5)
        call = channel.unary_unary(SLOW)
        started = time.monotonic()
        try:
            call(b"", timeout=0.3)  # the config's 0.3 s, per call (see above)
            status = "OK"
        except grpc.RpcError as e:
            status = e.code().name
        took = round((time.monotonic() - started) * 1000, 1)
        channel.close()
        with scripted.lock:
            told = list(scripted.told)
        print(json.dumps({"status": status, "took_ms": took, "told_ms": told}), flush=True)
        server.stop(0)
        return
    else:
        channel = grpc.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.service_config", CONFIG), ("grpc.enable_retries", 1)],
        )
        finals = {}
        for method in SCRIPT:
            call = channel.unary_unary(method)
            try:
                call(b"", timeout=10)
                finals[method] = "OK"
            except grpc.RpcError as e:
                finals[method] = e.code().name
        channel.close()
        # What the client ended with must be what the server sent last.
        assert finals == scripted.final_statuses(), (finals, scripted.final_statuses())
    print(json.dumps(scripted.report(scripted.final_statuses()), sort_keys=True), flush=True)
    server.stop(0)


if __name__ == "__main__":
    main()
