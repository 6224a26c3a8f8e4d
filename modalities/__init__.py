"""Modality adapters, one subpackage per model family (adapter + tiny-model builder).

Importing this package registers the built-in adapters in :mod:`mmgrpo.plugins`. Shared token-policy
machinery (KV-expanded sampling, prefix sharing) lives in :mod:`mmgrpo.modalities.tokens`; Hugging Face plumbing
(unwrap, LoRA, dtypes, the tiny-model cache) in :mod:`mmgrpo.modalities._hf`. See docs/architecture.md.
"""

from .ar_image import adapter as _ar_image  # noqa: F401
from .flow import adapter as _flow  # noqa: F401
from .speech import adapter as _speech  # noqa: F401
from .speech import audio_llm as _audio_llm  # noqa: F401
from .video import adapter as _video  # noqa: F401
from .vlm import adapter as _vlm  # noqa: F401
