"""STAND-IN for ``torch-xla``; NOT its code. See ../_standin_lowering.py and
core/xla_model.py."""
