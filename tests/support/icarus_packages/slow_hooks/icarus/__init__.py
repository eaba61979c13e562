"""TEST FAKE Icarus package: its ``pre_llm_call`` hook takes ``ICARUS_FAKE_SLOW_S`` seconds
(default 600: longer than any worker call's deadline), as a backend that hangs would, and its
``on_session_end`` ``ICARUS_FAKE_SLOW_END_S`` (default 0); the Fabric
tools answer at once. The worker program loads it by path; nothing here imports castor."""
