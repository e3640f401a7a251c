# Type stubs for kiln.distributed (python/kiln/distributed.py).
import os
from typing import Any, Dict, Optional, Union

from . import Engine

def build(model: Any, example_inputs: Any = ..., *, group: Any = ..., build_on: str = ...,
          cache_dir: Optional[Union[str, os.PathLike]] = ..., trust_shared_cache: bool = ...,
          join_timeout: float = ..., wait_timeout: float = ..., transfer_timeout: float = ...,
          heartbeat_timeout: float = ..., **options: Any) -> Engine: ...
def refit(engine: Engine, weights: Any = ..., *, group: Any = ...,
          timeout: float = ...) -> Dict[str, Any]: ...
