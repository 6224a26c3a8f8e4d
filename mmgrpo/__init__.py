"""mmgrpo: group-relative policy optimisation for multimodal and generative models on one core."""

__version__ = "0.1.0"
