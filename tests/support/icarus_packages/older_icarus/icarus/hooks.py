"""Only the session's start: no ``pre_llm_call``, ``post_llm_call`` or ``on_session_end``."""


def on_session_start(**_kwargs):
    return {"context": "[facts]\n  an older Icarus"}
