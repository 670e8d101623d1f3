from os import PathLike
from typing import Iterator, List, Optional, Sequence, TypedDict, Union

_Path = Union[str, PathLike[str]]
_Setting = Union[None, bool, int, float, str]

SETTINGS: List[str]

class LladaError(RuntimeError): ...
class SettingError(ValueError): ...

class Counters(TypedDict):
    forward_passes: int
    rows_computed: int
    logit_rows_computed: int
    forward_seconds: float
    staged_bytes: int
    stall_seconds: float
    copy_seconds: float
    side_path_starts: int
    context_loads: int

class Generation(TypedDict):
    text: str
    output_ids: List[int]
    prompt_ids: List[int]
    reveals: List[List[List[int]]]
    revisions: Optional[List[List[List[int]]]]
    forward_passes: int
    rows_computed: int
    drafts_confirmed: int
    seconds: float
    counters: Counters

class StepView(TypedDict):
    step: int
    steps: int
    generated: List[int]
    mask_id: int
    committed: List[List[int]]
    revised: List[List[int]]
    settled: int
    settled_text: str

class CompileSummary(TypedDict):
    output: str
    bytes: int
    tensors: int
    graphs: int
    quant: str
    max_seq: int
    warnings: List[str]

class Model:
    def __init__(self, path: _Path) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def max_len(self) -> int: ...
    @property
    def mask_id(self) -> int: ...
    def encode(self, text: str) -> List[int]: ...
    def encode_chat(self, user: str) -> List[int]: ...
    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str: ...
    def answer(self, ids: Sequence[int]) -> str: ...
    def session(
        self,
        threads: Optional[int] = None,
        backend: str = "host",
        staging: str = "async",
        experts: Optional[str] = None,
        cpu_threads: Optional[int] = None,
    ) -> Session: ...

class Session:
    @property
    def model(self) -> Model: ...
    @property
    def backend(self) -> str: ...
    @property
    def threads(self) -> int: ...
    @property
    def counters(self) -> Counters: ...
    def generate(self, prompt: Optional[str] = None, ids: Optional[Sequence[int]] = None, chat: bool = False, **settings: _Setting) -> Generation: ...
    def steps(self, prompt: Optional[str] = None, ids: Optional[Sequence[int]] = None, chat: bool = False, **settings: _Setting) -> Steps: ...

class Steps(Iterator[StepView]):
    def __iter__(self) -> Steps: ...
    def __next__(self) -> StepView: ...
    @property
    def result(self) -> Optional[Generation]: ...
    def close(self) -> None: ...

def compile(
    model: _Path,
    output: _Path,
    *,
    target: str = "host",
    quant: Optional[str] = None,
    dtype: Optional[str] = None,
    group: Optional[int] = None,
    max_seq: Optional[int] = None,
    logit_rows: int = 256,
    block_len: int = 32,
    spec_blocks: Optional[int] = None,
    activations: str = "f32",
    activation_scales: Optional[str] = None,
    window_bytes: Optional[int] = None,
    kv_dtype: Optional[str] = None,
    host_only: bool = False,
    qnn_lib: Optional[_Path] = None,
    npu_contexts: Optional[int] = None,
    npu_shared_weights: bool = False,
    npu_estimate_soc: Optional[int] = None,
    npu_activations: Optional[str] = None,
    calibration: Optional[_Path] = None,
    npu_sessions: Optional[int] = None,
    npu_session_bytes: Optional[int] = None,
    progress: bool = False,
) -> CompileSummary: ...
