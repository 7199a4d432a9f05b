"""Stubs of the compiled per-call path (pycoll/_core.pyx)."""

from typing import Any, Callable, Dict, List, Optional, Sequence

from .buffers import Buffer

__all__ = ["CommCore", "Hook", "Lock", "RLock", "Work", "launch", "refresh", "retire", "begin", "buf",
           "all_reduce", "broadcast", "send", "recv", "GroupScope", "library_call", "open_group",
           "group_library", "set_group", "DLPACK_CAPSULE_DESTRUCTOR"]

DLPACK_CAPSULE_DESTRUCTOR: int

def open_group() -> Optional[List[Work]]: ...
def group_library() -> Any: ...
def set_group(works: Optional[List[Work]], library: Any) -> None: ...

class Lock:
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...
    def release(self) -> None: ...
    def locked(self) -> bool: ...
    def __enter__(self) -> bool: ...
    def __exit__(self, *exc: Any) -> None: ...

class RLock(Lock): ...

class Hook:
    @property
    def compiled_hooks(self) -> bool: ...

class CommCore:
    _handle: Optional[int]
    library: Any
    device: Any
    name: str
    timeout: float
    backend: str
    _rank: int
    _size: int
    @property
    def _lock(self) -> RLock: ...
    @property
    def _plock(self) -> Lock: ...
    @property
    def _hlock(self) -> Lock: ...
    _pending: Dict[Work, None]
    _events: List[int]
    _failure: Optional[BaseException]
    _state: str
    _stream: Optional[int]
    _user: Optional[int]
    _owner: int
    _last_op_id: int
    _coll_seq: int
    _p2p_seq: int
    _stream_mode: int
    _guard_device: bool

class Work:
    comm: Any
    op: str
    seq: int
    p2p_seq: int
    op_id: int
    async_op: bool
    is_p2p: bool
    peer: Optional[int]
    timeout: float
    stream: int
    inputs: List[Any]
    outputs: List[Any]
    time_created_ns: int
    t0: float
    time_started_ns: Optional[int]
    time_completed_ns: Optional[int]
    duration_ms: Optional[float]
    _start: Optional[int]
    _end: Optional[int]
    _state: str
    _exc: Optional[BaseException]
    capture_id: Optional[int]
    fr_entry: Any
    fr_pos: int
    def __init__(self, comm: Any, op: str, seq: int, p2p_seq: int, op_id: int, is_p2p: bool, peer: Optional[int],
                 timeout: float, stream: int, inputs: Sequence[Any], outputs: Sequence[Any], async_op: bool = ...,
                 capture_id: Optional[int] = ...) -> None: ...
    @property
    def state(self) -> str: ...
    @property
    def last_state(self) -> str: ...
    @property
    def error(self) -> Optional[BaseException]: ...
    @property
    def deadline(self) -> float: ...
    def release_arrays(self) -> None: ...
    def is_completed(self) -> bool: ...
    def exception(self) -> Optional[BaseException]: ...
    def wait(self, timeout: Optional[float] = ...) -> None: ...

def launch(comm: Any, op: str, call: Callable[[int, int], Any], stream: int, inputs: Sequence[Buffer],
           outputs: Sequence[Buffer], async_op: bool, timeout: Optional[float], peer: Optional[int] = ...) -> Work: ...
def refresh(comm: Any, w: Work) -> None: ...
def retire(comm: Any, w: Work) -> None: ...
def begin(comm: Any, what: str, stream: Any, async_op: bool, arrays: Sequence[Any]) -> int: ...
class GroupScope:
    def __init__(self, comm: Any) -> None: ...
    def __enter__(self) -> None: ...
    def __exit__(self, typ: Any, value: Any, tb: Any) -> bool: ...
def buf(comm: Any, obj: Any, stream: int, *, writable: bool, name: str) -> Buffer: ...
def all_reduce(comm: Any, tensor: Any, output: Any = ..., op: Any = ..., *, stream: Any = ..., async_op: bool = ...,
               timeout: Optional[float] = ..., config: Any = ...) -> Work: ...
def broadcast(comm: Any, tensor: Any, root: int = ..., output: Any = ..., *, stream: Any = ...,
              async_op: bool = ..., timeout: Optional[float] = ..., config: Any = ...) -> Work: ...
def send(comm: Any, tensor: Any, peer: int, *, stream: Any = ..., async_op: bool = ...,
         timeout: Optional[float] = ...) -> Work: ...
def recv(comm: Any, tensor: Any, peer: int, *, stream: Any = ..., async_op: bool = ...,
         timeout: Optional[float] = ...) -> Work: ...
def library_call(library: Any, what: str, cc: Sequence[Any], send: int, recv: int, count: int, datatype: int,
                 op: int = ..., root: int = ...) -> Callable[[int, int], int]: ...
