"""`vitdeploy check`: layered evidence that a deployed artifact computes what PyTorch computes.

Three kinds of evidence (chapter §39.7): numeric (operators correspond), task (accuracy survives on
real images) and protocol (preprocessing, labels and patch grid are the model's own: a high accuracy
can hide a preprocessing error the model happened to absorb). When numbers disagree, localisation
names the first PyTorch module whose output diverges.
"""

from .run import CheckOptions, run_check

__all__ = ["CheckOptions", "run_check"]
