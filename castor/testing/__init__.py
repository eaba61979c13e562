"""The demo's scenarios, the fault-injection soak and its invariant checks.

It sits above the runtime, the endpoint and the scale-out backends and drives them; the CLI
(``castor demo``, ``castor soak``) sits above it. Nothing below it imports it: the scale-out
host runs a fault injector it is handed, it does not know the soak.
"""
