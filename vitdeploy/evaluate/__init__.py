"""`vitdeploy evaluate`: is the deployed model fit for the conditions it will meet?

    transforms.py  the shift suite: seeded numpy/Pillow perturbations, each with a declared rule
    score.py       accuracy with 95% Wilson intervals, drop vs clean, agreement, class/size strata
    runners.py     the graphs (in the execution they target), engines, the PyTorch reference, fed the
                   bundle's input contract's feeds (variable-size bundles: canvas + valid_hw)
    run.py         the evaluation over conditions and resolutions
    occlusion.py   occlusion sensitivity computed by the deployed graph
    occlusion_map.py  the --occlusion-map command: maps, overlays and their record
    report.py      evaluate.json / .csv / .png, the terminal summary, the progress bar

numpy, Pillow and the runners' own runtimes only; torch is imported when the reference is rebuilt.
"""

from __future__ import annotations

from .occlusion_map import OcclusionOptions, run_occlusion_map
from .run import SCHEMA, EvaluateOptions, EvaluateResult, run_evaluate

__all__ = ["SCHEMA", "EvaluateOptions", "EvaluateResult", "OcclusionOptions", "run_evaluate", "run_occlusion_map"]
