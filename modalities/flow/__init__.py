"""Flow-matching / diffusion policies: ``adapter.py`` (diffusers), ``kernels.py``, ``steps.py``, ``tiny.py``."""
