"""The operator's live web console and Prometheus ``/metrics`` of a serving runtime.

``castor serve … --console 127.0.0.1:PORT`` starts :class:`~castor.console.server.ConsoleServer`
beside the msgpack-rpc endpoint (see docs/operations.md).
"""
