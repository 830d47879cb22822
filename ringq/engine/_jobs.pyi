# The compiled module of csrc/ext/jobs.c (ringq/engine/runs.py documents it).
from collections.abc import Callable, Sequence
from typing import Any

from ringq.job import Job

def setup(
    job_type: type[Job],
    names: tuple[str, ...],
    slots: tuple[Any, ...],
    undecoded: Any,
    leased: Any,
    ready: Any,
    token_one: str,
    serialization_error: type[BaseException],
) -> None: ...
def build(
    run: bytes,
    mm: Any,
    base: int,
    size: int,
    epoch_ms: int,
    segseq: int,
    origin: int,
    keyed: int,
    key_of: Callable[[bytes], str],
    held: dict[tuple[int, int], int] | None,
    mark_bad: Callable[[Any, int, str], None],
    seg: Any,
) -> list[Job]: ...
def fresh(
    placed: list[tuple[int, int, int]],
    heads: list[int],
    seq0: int,
    enq_us: int,
    avail_ms: int,
    payloads: Sequence[Any],
    job_ids: Sequence[str] | None,
    priority: int,
    max_attempts: int,
    key: str | None,
    shown: tuple[Any, Any, Any, Any, Any],
    origin: int,
) -> list[Job]: ...
def set_ack(address: int) -> None: ...
def first_ack(
    job: Any, views: dict[int, Any], identity: int, ctl_ref_addr: int, out_addr: int
) -> tuple[Any, int] | int | None: ...
def set_express(append_address: int, max_depth: int) -> None: ...
def express(
    plan_address: int,
    payload: dict[str, Any],
    max_attempts: int,
    lock_fd: int,
    segseq: int,
    origin: int,
) -> Job | int: ...
def payload(
    json_codec: int,
    long_digits: int,
    orjson_loads: Callable[[bytes], Any] | None,
    json_scan: Callable[[str, int], tuple[Any, int]],
    slow_payload: Callable[[Job], Any],
) -> Any: ...
def set_wait(address: int) -> None: ...
def wait_job(
    seg_ref: int,
    keep: Any,
    ctl_ref: int,
    args: int,
    out: int,
    rec: int,
    segseq: int,
    origin: int,
    keyed: int,
) -> None | int | tuple[int, int, int, bytes | None, Job | None]: ...
