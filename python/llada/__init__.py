"""llada: compile diffusion LLM checkpoints ahead of time (``llada.compile``) and run them
(``llada.Model``, ``Model.session``, ``Session.generate``, ``Session.steps``).

Settings are the ``llada-rt`` flags with underscores (``gen_len``, ``block_len``, ``steps``,
``temperature``, ``cfg``, ``policy``, ...; ``llada.SETTINGS`` lists them). A setting the model
cannot serve raises ``llada.SettingError`` (a ``ValueError``) naming it; a missing file
``FileNotFoundError``; a failure of the runtime ``llada.LladaError`` (a ``RuntimeError``).
"""

from ._llada import SETTINGS, LladaError, Model, Session, SettingError, Steps, compile

__all__ = ["SETTINGS", "LladaError", "Model", "Session", "SettingError", "Steps", "compile"]
