"""ep_rt: expert-parallel dispatch and combine for PyTorch MoE models, with DeepEP V1's API.

CUDA kernels ship as ahead-of-time cubins; this package is pure Python. Importing it loads no CUDA
driver and touches no GPU, so everything (including the reference implementation) imports on CPU.
"""
from .buffer import Buffer
from .config import Config
from .events import EventHandle, EventOverlap
from .validate import topk_idx_t

__version__ = "0.1.0"
__all__ = ["Buffer", "Config", "EventHandle", "EventOverlap", "topk_idx_t", "__version__"]
