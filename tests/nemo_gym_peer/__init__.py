"""Tests against the real NeMo Gym 0.7.0, run in its own Python 3.13 venv (`make nemo-gym`).

NeMo Gym's own code does its part in every test here: its collector, resume, aggregation, record
models and server classes run in `.venv-nemo-gym` (`peer/*.py`, run by `run_peer`), and gym-failures
reads or resumes what they wrote, or the other way round. Nothing here copies or rebuilds NeMo Gym's
behaviour. The peer scripts import `nemo_gym`, which the project's own venv does not have: they run
only in NeMo Gym's venv, never under pytest's interpreter.
"""
