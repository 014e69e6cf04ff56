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


def install_deep_ep_alias():
    """Let code that says `import deep_ep` (deep_ep, deep_ep.buffer, deep_ep.utils) get ep_rt in this process;
    call it before that code imports deep_ep. Refuses (DeepEPAliasError) when a real DeepEP is installed or
    already imported: ep_rt never shadows it. For every process of an environment (spawned workers too), see
    `python -m ep_rt alias`. Returns the deep_ep module (a view of ep_rt: `deep_ep.Buffer is ep_rt.Buffer`)."""
    import _ep_rt_deep_ep  # stdlib only, next to this package (see its docstring)

    return _ep_rt_deep_ep.install()
