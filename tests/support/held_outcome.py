"""A castor process whose cast actor holds a utility command's outcome before it applies it: the
command has ended, the cast has not saved what it ended with. It writes the visit's id to the file
``$HELD`` names and sleeps until killed, so a test can ``kill -9`` it exactly in that window (a
test-only wrapper: castor itself has no such hold)."""

from __future__ import annotations


def held_castor(*leading_args: str) -> str:
    """The program (for ``python -c``) of ``castor <leading_args> <its own argv>`` with the hold."""
    return f"""
import os, sys, time
from castor.actors.materia import cast_actor
from castor.domain.materia.cast_messages import UtilityFinished

applies = cast_actor.CastActor._on_outcome

def held(self, message):
    if isinstance(message.event, UtilityFinished):
        with open(os.environ["HELD"], "w") as mark:
            mark.write(message.event.visit_id)
        time.sleep(600)
    return applies(self, message)

cast_actor.CastActor._on_outcome = held  # an actor binds its handlers by name at each incarnation
from castor.cli.app import main
sys.exit(main([*{list(leading_args)!r}, *sys.argv[1:]]))
"""
