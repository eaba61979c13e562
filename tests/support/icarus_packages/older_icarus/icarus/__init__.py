"""TEST FAKE Icarus package of an older or customised install: it has ``on_session_start`` and
``fabric_search`` and lacks every other hook and tool. The worker program loads it by path;
nothing here imports castor."""
