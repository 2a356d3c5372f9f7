"""Run a model on the node's device and record every aten operator that reaches the backend.

A ``TorchDispatchMode`` sees operators after autograd and after CompositeImplicitAutograd decompositions, i.e.
exactly the calls a backend must serve. Each operator overload is recorded with its call count, its input
signatures (dtype and rank of each tensor) and one example call, which the smoke test replays later.

An operator that the backend cannot run does not stop the trace: the failure is recorded and, so the model can go
on, its result comes from the CPU (on an accelerator) or from its meta/fake kernel as zeros (on the CPU). Warnings
that a backend fell back to the CPU (MPS, some vendor plugins) are recorded per operator too.
"""

from __future__ import annotations

import inspect
import re
import time
import warnings
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils._python_dispatch import TorchDispatchMode

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
               torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
               torch.bool: "bool", torch.float8_e4m3fn: "fp8e4m3", torch.float8_e5m2: "fp8e5m2"}
# How dispatch says "this backend has no kernel for this operator / dtype"; anything else is a real error.
UNSUPPORTED = re.compile(r"not implemented|not supported|could not run|no kernel|unsupported", re.IGNORECASE)
FALLBACK_WARNING = re.compile(r"fall(s)? ?back|falling back", re.IGNORECASE)
MAX_SIGNATURES = 8


def operator_name(func) -> str:
    """``aten::mm.default``: the schema name and the overload name, the unit in which kernels are registered."""
    return f"{func._schema.name}.{func._overloadname}"


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def describe_argument(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{dtype_name(value.dtype)}:{value.dim()}d"
    if isinstance(value, list | tuple):
        return "[" + ",".join(describe_argument(item) for item in value) + "]"
    return type(value).__name__


@dataclass
class TensorExample:
    """How to rebuild an input tensor: layout always, values only for integer/bool tensors (indices, offsets)
    because random values there would index out of range; floating values are drawn at random."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    storage_elements: int
    values: torch.Tensor | None


@dataclass
class OperatorRecord:
    name: str
    overload: object
    count: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    signatures: dict[str, int] = field(default_factory=dict)
    example: tuple | None = None
    failures: int = 0
    error: str | None = None
    cpu_fallback: str | None = None

    def as_dict(self) -> dict:
        signatures = sorted(self.signatures, key=self.signatures.get, reverse=True)
        return {"name": self.name, "count": self.count, "phases": self.phases,
                "signatures": signatures[:MAX_SIGNATURES], "signature_count": len(signatures),
                "failures": self.failures, "error": self.error, "cpu_fallback": self.cpu_fallback}


def capture_example(args, kwargs) -> tuple:
    def capture(value):
        if not isinstance(value, torch.Tensor):
            return value
        exact = not (value.is_floating_point() or value.is_complex())
        elements = value.untyped_storage().nbytes() // max(value.element_size(), 1)
        return TensorExample(value.dtype, tuple(value.shape), tuple(value.stride()), value.storage_offset(),
                             elements, value.detach().clone() if exact else None)

    return tree_map(capture, (args, kwargs))


def materialize_example(example: tuple, device: torch.device, generator: torch.Generator) -> tuple:
    """The ``(args, kwargs)`` of a captured call, rebuilt on ``device`` with fresh random floating values."""

    def build(value):
        if not isinstance(value, TensorExample):
            return value
        if value.values is not None:
            return value.values.to(device)
        base = torch.randn(max(value.storage_elements, 1), generator=generator).to(device=device, dtype=value.dtype)
        return base.as_strided(value.shape, value.stride, value.storage_offset)

    return tree_map(build, example, is_leaf=lambda value: isinstance(value, TensorExample))


class OperatorRecorder(TorchDispatchMode):
    """Records operators; ``phase`` names the part of the run (prefill/decode) being traced."""

    def __init__(self, keep_examples: bool = True):
        super().__init__()
        self.operators: dict[str, OperatorRecord] = {}
        self.keep_examples = keep_examples
        self.phase = "run"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = operator_name(func)
        record = self.operators.get(name)
        if record is None:
            record = self.operators[name] = OperatorRecord(name, func)
        record.count += 1
        record.phases[self.phase] = record.phases.get(self.phase, 0) + 1
        signature = "(" + ", ".join(describe_argument(value) for value in tree_flatten((args, kwargs))[0]) + ")"
        record.signatures[signature] = record.signatures.get(signature, 0) + 1
        if record.example is None and self.keep_examples:
            record.example = capture_example(args, kwargs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = func(*args, **kwargs)
            except (NotImplementedError, RuntimeError) as error:
                if not (isinstance(error, NotImplementedError) or UNSUPPORTED.search(str(error))):
                    raise
                record.failures += 1
                record.error = record.error or first_line(error)
                result = stand_in_result(func, args, kwargs)
        for warning in caught:
            if FALLBACK_WARNING.search(str(warning.message)):
                record.cpu_fallback = record.cpu_fallback or first_line(warning.message)
        return result


def first_line(message) -> str:
    text = str(message).strip()
    return (text.splitlines() or [type(message).__name__])[0][:300]


def stand_in_result(func, args, kwargs):
    """A result that lets the model go on after ``func`` failed: computed on the CPU when the inputs live on an
    accelerator, else shaped by the meta (fake) kernel and filled with zeros. Raises if neither is possible."""
    tensors = [value for value in tree_flatten((args, kwargs))[0] if isinstance(value, torch.Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")

    def move(target):
        return lambda value: value.to(target) if isinstance(value, torch.Tensor) else value

    if device.type != "cpu":
        try:
            cpu_args, cpu_kwargs = tree_map(move("cpu"), (args, kwargs))
            return tree_map(move(device), func(*cpu_args, **cpu_kwargs))
        except (NotImplementedError, RuntimeError):
            pass  # a vendor-only operator has no CPU kernel either: shape the result from its meta kernel
    returns = func._schema.returns
    if len(returns) == 1 and returns[0].alias_info is not None and returns[0].alias_info.is_write:
        # An in-place or out= operator returns the tensor it writes; it stays as it was.
        return args[0] if args else next(iter(kwargs.values()))
    meta_args, meta_kwargs = tree_map(move("meta"), (args, kwargs))
    meta_result = func(*meta_args, **meta_kwargs)
    return tree_map(lambda value: torch.zeros(value.shape, dtype=value.dtype, device=device)
                    if isinstance(value, torch.Tensor) else value, meta_result)


@dataclass
class Trace:
    operators: dict[str, OperatorRecord]
    seconds: float
    prompt_tokens: int
    decode_steps: int
    error: str | None = None


def trace_model(model, *, prompt_tokens: int = 8, decode_steps: int = 3, seed: int = 0) -> Trace:
    """Prefill ``prompt_tokens`` random tokens, then decode greedily ``decode_steps`` tokens with the KV cache.

    An error that is not a missing kernel stops the run; the operators recorded until then are kept and the
    error is returned in ``Trace.error``.
    """
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    input_ids = torch.randint(0, vocab, (1, prompt_tokens), generator=generator).to(device)
    # transformers 5.x renamed `past_key_values` to `cache`; take whichever this version's forward accepts.
    cache_keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    recorder = OperatorRecorder()
    started = time.perf_counter()
    error = None
    try:
        with torch.no_grad(), recorder:
            recorder.phase = "prefill"
            output = model(input_ids=input_ids, use_cache=True)
            recorder.phase = "decode"
            for _ in range(decode_steps):
                next_ids = output.logits[:, -1:].argmax(-1)
                cache = getattr(output, "cache", None) or output.past_key_values
                output = model(input_ids=next_ids, use_cache=True, **{cache_keyword: cache})
    except Exception as exception:  # the report must come back even when the model cannot run here
        error = f"{type(exception).__name__}: {first_line(exception)}"
    return Trace(recorder.operators, time.perf_counter() - started, prompt_tokens, decode_steps, error)
