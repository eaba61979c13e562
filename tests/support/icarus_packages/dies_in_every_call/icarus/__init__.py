"""TEST FAKE Icarus package: its worker process dies in every call (``os._exit(3)``), unless the
file named by ``ICARUS_FAKE_HEALTHY`` exists, when every call answers (the package was fixed).
The worker program loads it by path; nothing here imports castor."""
