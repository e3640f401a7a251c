# Type stubs for kiln's Python API (python/kiln/__init__.py).
import os
from typing import Any, Callable, Dict, Iterable, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from . import distributed as distributed

_Path = Union[str, os.PathLike]
_Dims = Sequence[int]
_Profile = Tuple[_Dims, _Dims, _Dims]
# What Engine.refit and load(weights=) take: an ONNX path, ONNX bytes, an onnx.ModelProto or a
# mapping from initializer name to tensor.
_Weights = Union[_Path, bytes, Any, Mapping[str, Any]]
# progress(phase, done, total, elapsed_s, detail) -> False cancels
_Progress = Callable[[str, int, int, float, str], Optional[bool]]

class KilnError(RuntimeError):
    number: int
    code: str
    name: str
    message: str
    remedy: str
    builder_code: str  # distributed builds: the code that failed the job (the builder's own)
    def __init__(self, number: int, code: str, name: str, message: str, remedy: str) -> None: ...

class TensorInfo(NamedTuple):
    name: str
    dtype: torch.dtype
    shape: Tuple[int, ...]
    is_input: bool
    profile: Optional[Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]]

class Engine:
    backend: str
    arch: str
    inputs: Tuple[TensorInfo, ...]
    outputs: Tuple[TensorInfo, ...]
    data_dependent_outputs: Tuple[str, ...]
    build_once_report: Dict[str, Any]
    @property
    def report(self) -> Dict[str, Any]: ...
    def serialize(self, strip_weights: bool = ...) -> bytes: ...
    def save(self, path: _Path, strip_weights: bool = ...) -> None: ...
    def create_execution_context(self, cuda_graphs: bool = ...) -> ExecutionContext: ...
    def refit(self, weights: Union[_Path, bytes, Any, Mapping[str, Any]]) -> Dict[str, Any]: ...
    @property
    def weights_generation(self) -> int: ...
    def __init__(self, handle: int) -> None: ...

class ExecutionContext:
    engine: Engine
    def __init__(self, engine: Engine, cuda_graphs: bool = ...) -> None: ...
    def bind(self, name: str, tensor: torch.Tensor) -> None: ...
    def shape(self, name: str) -> Tuple[int, ...]: ...
    def max_shape(self, name: str) -> Tuple[int, ...]: ...
    def execute(self, stream: Union[None, int, torch.cuda.Stream] = ...) -> None: ...
    def run(self, inputs: Union[torch.Tensor, Sequence[torch.Tensor], Mapping[str, torch.Tensor]],
            outputs: Optional[Mapping[str, torch.Tensor]] = ...,
            stream: Union[None, int, torch.cuda.Stream] = ...) -> Dict[str, torch.Tensor]: ...
    def __call__(self, *inputs: torch.Tensor) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]: ...
    @property
    def graph_captures(self) -> int: ...
    @property
    def graph_launches(self) -> int: ...

def version() -> str: ...
def load(path: _Path, weights: Optional[_Weights] = ...) -> Engine: ...
def deserialize(data: bytes, weights: Optional[_Weights] = ...) -> Engine: ...
def build(model: Union[_Path, bytes, torch.nn.Module],
          example_inputs: Union[None, torch.Tensor, Sequence[torch.Tensor]] = ..., *,
          backend: str = ..., fp16: bool = ..., bf16: bool = ..., int8: bool = ...,
          fp8: bool = ...,
          profiles: Optional[Mapping[str, _Profile]] = ...,
          deadline: Union[None, float, str] = ...,
          memory_budget: Union[None, int, float, str] = ...,
          max_kernel_time: Optional[float] = ..., timing_cache: Optional[_Path] = ...,
          calibration: Union[None, _Path, Iterable[Any]] = ...,
          calib_method: Optional[str] = ..., calib_percentile: Optional[float] = ...,
          calib_cache: Optional[_Path] = ...,
          int8_tolerance: Union[None, float, str] = ..., calib_on_cpu: bool = ...,
          fp8_tolerance: Union[None, float, str] = ...,
          fp8_edges: bool = ..., int8_edges: bool = ...,
          quantized_if_faster: Optional[bool] = ..., optimize: bool = ...,
          progress: Optional[_Progress] = ..., exporter: str = ...,
          input_names: Optional[Sequence[str]] = ..., output_names: Optional[Sequence[str]] = ...,
          dynamic_axes: Optional[Mapping[str, Any]] = ..., opset: Optional[int] = ...,
          distributed: Any = ..., build_on: str = ..., cache_dir: Optional[_Path] = ...,
          trust_shared_cache: bool = ..., join_timeout: float = ..., wait_timeout: float = ...,
          transfer_timeout: float = ..., heartbeat_timeout: float = ...) -> Engine: ...
