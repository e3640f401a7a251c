# Type stubs for kiln.distributed (python/kiln/distributed.py).
from typing import Any

from . import Engine

def build(model: Any, example_inputs: Any = ..., *, group: Any = ..., join_timeout: float = ...,
          wait_timeout: float = ..., transfer_timeout: float = ...,
          heartbeat_timeout: float = ..., **options: Any) -> Engine: ...
