"""The grading boundary's wire: plain data between the checker's process and the student's kernel.

At grading, a check runs in the checker's process and the student's code in the student's kernel.
They talk over a Unix socket, one `Conversation` per check, and exchange only plain data:
numbers, strings, lists, tuples, dicts, sets, slices, tensors and numpy arrays (their bytes, dtype
and shape), dtypes and devices, and the course's own frozen dataclasses and named tuples rebuilt
from their fields. Never a pickle: nothing the kernel sends can make the checker run code of the kernel's choosing.

Everything else stays where it lives and crosses as a *handle*: the other side gets a `Remote`
that forwards calls, attribute reads and the container protocol back over the wire. So a check
calls the student's class or function as if it were local, and the student's function calls the
model the check lends it, which runs in the checker's process. Lists, dicts, deques and sets
passed as arguments come back as the callee left them (a list of timestamps the student's loop
fills, for example).

Either side may call the other while it waits for an answer (the check calls the student's
generate loop, which calls the checker's model, which calls the student's cache): a
`Conversation` answers requests until the reply it waits for arrives.

Security of the checker's side: it serves only what it lent, refuses attribute names that start
with an underscore, and never lends a module, a class or a function that is not a method of an
object it lent (so that no chain of attribute reads reaches the checker's interpreter)."""

import builtins
import dataclasses
import importlib
import inspect
import json
import math
import socket
import struct
import types
from collections import deque
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack

HEADER = struct.Struct("<QQ")  # the JSON header's length, then the payload's
MAX_MESSAGE_BYTES = 1 << 31
LIBRARY_PREFIX = "infer."
TENSOR_DTYPES = {
    str(dtype): dtype
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}
NUMPY_DTYPES = {"float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"}
CONTAINER_METHODS = ("__len__", "__getitem__", "__contains__", "__iter__", "__call__")
MUTABLE = (list, dict, deque, set)


class WireError(RuntimeError):
    """The other side broke the protocol, or sent something that is not plain data."""


class RemoteError(Exception):
    """An exception raised on the other side; its class name is the one raised there."""


def remote_exception(kind: str, message: str) -> Exception:
    """The exception to raise here for one raised over there: the builtin class of that name
    (NotImplementedError, AttributeError, ...), else a RemoteError subclass with the name."""
    found = getattr(builtins, kind, None)
    if isinstance(found, type) and issubclass(found, Exception):
        try:
            return found(message)
        except Exception:  # a builtin with another signature (UnicodeDecodeError, ...)
            pass
    name = kind if kind.isidentifier() else "RemoteError"
    return type(name, (RemoteError,), {})(message)


class Remote:
    """An object that lives on the other side of a conversation: calls, attribute reads and the
    container protocol go over the wire."""

    __slots__ = ("_conversation", "_handle", "_type")

    def __init__(self, conversation: "Conversation", handle: int, type_name: str):
        object.__setattr__(self, "_conversation", conversation)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_type", type_name)

    def _ask(self, method: str, *args, **kwargs):
        return self._conversation.request("call_method", self._handle, method, list(args), kwargs)

    def __call__(self, *args, **kwargs):
        return self._ask("__call__", *args, **kwargs)

    def __getattr__(self, name: str):
        return self._conversation.request("getattr", self._handle, name)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"a {self._type} on the other side of the grading boundary is read-only here")

    def __len__(self) -> int:
        return self._ask("__len__")

    def __getitem__(self, key):
        return self._ask("__getitem__", key)

    def __contains__(self, item) -> bool:
        return self._ask("__contains__", item)

    def __iter__(self):
        return iter(self._ask("__iter__"))

    def __repr__(self) -> str:
        return f"<{self._type}, in the other process>"

    @property
    def remote_type(self) -> str:
        return self._type


# ---------------------------------------------------------------- plain data, both ways


def _is_course_module(name: str) -> bool:
    """The course library's modules, but not grading's: only their values are rebuilt over there."""
    return name.startswith(LIBRARY_PREFIX) and not name.startswith("infer.course.grading")


def _class_path(value) -> str | None:
    """`module:qualname` of a course value that can be rebuilt from its fields over there: a frozen
    dataclass or a named tuple. A mutable one (the engine's Work, a Sequence) crosses as a handle:
    the check needs the very object back, as the student's code left it."""
    kind = type(value)
    module = kind.__module__ or ""
    if not _is_course_module(module):
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and kind.__dataclass_params__.frozen:
        return f"{module}:{kind.__qualname__}"
    if isinstance(value, tuple) and hasattr(kind, "_fields"):
        return f"{module}:{kind.__qualname__}"
    return None


def _course_class(path: str):
    module_name, _, qualname = path.partition(":")
    if not _is_course_module(module_name):
        raise WireError(f"{path!r} is not a course class")
    found: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not isinstance(found, type) or not (dataclasses.is_dataclass(found) or hasattr(found, "_fields")):
        raise WireError(f"{path!r} is not a course dataclass or named tuple")
    return found


class Encoder:
    """Turns a value into JSON plus buffers; what is not plain data becomes a handle."""

    def __init__(self, lend):
        self.lend = lend  # value -> handle id, or raises WireError if it may not be lent
        self.buffers: list[bytes] = []

    def buffer(self, data: bytes) -> int:
        self.buffers.append(data)
        return len(self.buffers) - 1

    def encode(self, value):
        if value is None or isinstance(value, (bool, str)):
            return value
        if type(value) is int:
            return value
        if type(value) is float:
            return value if math.isfinite(value) else {"$float": repr(value)}
        if isinstance(value, Remote):
            return {"$yours": value._handle}
        if isinstance(value, torch.dtype):
            return {"$dtype": str(value)}
        if isinstance(value, torch.device):
            return {"$device": str(value)}
        if type(value) is torch.Size:
            return {"$tuple": list(value)}
        if type(value) is slice:
            return {"$slice": [self.encode(value.start), self.encode(value.stop), self.encode(value.step)]}
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, (np.ndarray, np.generic)) and str(value.dtype) in NUMPY_DTYPES:
            array = np.ascontiguousarray(value)
            return {
                "$numpy": {
                    "dtype": str(array.dtype),
                    "shape": list(array.shape),
                    "buffer": self.buffer(array.tobytes()),
                },
                "scalar": isinstance(value, np.generic),
            }
        path = _class_path(value)
        if path:
            fields = (
                value._asdict()
                if isinstance(value, tuple)
                else {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            )
            return {"$class": path, "fields": {name: self.encode(v) for name, v in fields.items()}}
        if type(value) is list:
            return [self.encode(v) for v in value]
        if type(value) is tuple:
            return {"$tuple": [self.encode(v) for v in value]}
        if type(value) is deque:
            return {"$deque": [self.encode(v) for v in value]}
        if type(value) in (set, frozenset):
            return {"$set": [self.encode(v) for v in value], "frozen": type(value) is frozenset}
        if type(value) is dict:
            return {"$dict": [[self.encode(k), self.encode(v)] for k, v in value.items()]}
        return {"$handle": self.lend(value), "type": type(value).__name__}

    def _tensor(self, tensor: torch.Tensor):
        dtype = str(tensor.dtype)
        if dtype not in TENSOR_DTYPES:
            raise WireError(f"tensors of {dtype} do not cross the grading boundary")
        meta = {
            "dtype": dtype,
            "shape": list(tensor.shape),
            "device": str(tensor.device),
            "storage": tensor.untyped_storage().data_ptr() if tensor.device.type != "meta" else None,
        }
        if tensor.device.type != "meta":
            data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            meta["buffer"] = self.buffer(data)
        return {"$tensor": meta}


class Decoder:
    def __init__(self, conversation: "Conversation", buffers: list[memoryview]):
        self.conversation = conversation
        self.buffers = buffers

    def decode(self, value):
        if value is None or isinstance(value, (bool, str, int, float)):
            return value
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if not isinstance(value, dict) or len(value) == 0:
            raise WireError(f"not plain data: {type(value).__name__}")
        tag = next(iter(value))
        body = value[tag]
        if tag == "$float":
            if body not in ("nan", "inf", "-inf"):
                raise WireError(f"not a float: {body!r}")
            return float(body)
        if tag == "$dtype":
            if body not in TENSOR_DTYPES:
                raise WireError(f"not a dtype the boundary carries: {body!r}")
            return TENSOR_DTYPES[body]
        if tag == "$device":
            return torch.device(str(body))
        if tag == "$slice":
            return slice(*(self.decode(v) for v in body[:3]))
        if tag == "$tuple":
            return tuple(self.decode(v) for v in body)
        if tag == "$deque":
            return deque(self.decode(v) for v in body)
        if tag == "$set":
            items = [self.decode(v) for v in body]
            return frozenset(items) if value.get("frozen") else set(items)
        if tag == "$dict":
            return {self.decode(k): self.decode(v) for k, v in body}
        if tag == "$tensor":
            return self._tensor(body)
        if tag == "$numpy":
            return self._numpy(body, bool(value.get("scalar")))
        if tag == "$class":
            fields = {str(name): self.decode(v) for name, v in value["fields"].items()}
            kind = _course_class(body)
            return kind(**fields)
        if tag == "$handle":
            return Remote(self.conversation, int(body), str(value.get("type", "object"))[:80])
        if tag == "$yours":
            return self.conversation.lent_object(int(body))
        raise WireError(f"unknown tag {tag!r}")

    def _buffer(self, index) -> memoryview:
        if not isinstance(index, int) or not 0 <= index < len(self.buffers):
            raise WireError("a tensor points at a buffer that was not sent")
        return self.buffers[index]

    def _tensor(self, meta: dict) -> torch.Tensor:
        dtype = TENSOR_DTYPES.get(meta.get("dtype"))
        shape = [int(n) for n in meta["shape"]]
        if dtype is None or any(n < 0 for n in shape):
            raise WireError(f"not a tensor the boundary carries: {meta.get('dtype')!r}, {shape}")
        device = torch.device(str(meta["device"]))
        if device.type == "meta":
            tensor = torch.empty(shape, dtype=dtype, device="meta")
        else:
            data = self._buffer(meta.get("buffer"))
            if len(data) != math.prod(shape) * torch.empty((), dtype=dtype).element_size():
                raise WireError("a tensor's bytes do not match its shape")
            flat = (
                torch.frombuffer(bytearray(data), dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
            )
            tensor = flat.view(dtype).reshape(shape).to(device)
        tensor.remote_storage = meta.get("storage")  # where it lived over there (views share one)
        return tensor

    def _numpy(self, meta: dict, scalar: bool):
        if meta.get("dtype") not in NUMPY_DTYPES:
            raise WireError(f"not an array the boundary carries: {meta.get('dtype')!r}")
        array = np.frombuffer(bytes(self._buffer(meta.get("buffer"))), dtype=meta["dtype"]).reshape(meta["shape"])
        return array[()] if scalar else array.copy()


def storage_of(tensor) -> int | None:
    """Where a tensor's memory lives, on whichever side it was made: two reads that return views
    of one buffer share it there even though each crossed the boundary as a copy."""
    if not isinstance(tensor, torch.Tensor):
        return None
    remote = getattr(tensor, "remote_storage", None)
    return remote if remote is not None else tensor.untyped_storage().data_ptr()


def update_in_place(original, new) -> None:
    """Make a list, dict, deque or set passed across hold what the callee left in it."""
    if type(original) is not type(new):
        return
    if isinstance(original, list):
        original[:] = new
    elif isinstance(original, deque):
        original.clear()
        original.extend(new)
    elif isinstance(original, (dict, set)):
        original.clear()
        original.update(new)


# ---------------------------------------------------------------- the conversation


def _lendable(value) -> bool:
    """What the checker may hand the kernel by handle: instances, and methods bound to instances;
    never a module, a class or a free function (their attributes reach the checker's interpreter)."""
    if isinstance(value, (types.ModuleType, type)):
        return False
    if inspect.isroutine(value):
        owner = getattr(value, "__self__", None)
        return owner is not None and not isinstance(owner, (types.ModuleType, type))
    return True


class Conversation:
    """One socket between the checker and the kernel. `lends_freely`: the kernel's side, which
    may hand the checker anything; the checker's side lends only objects and their methods."""

    def __init__(self, sock: socket.socket, lends_freely: bool, on_request=None, watch=None):
        self.sock = sock
        self.lends_freely = lends_freely
        self.lent: list[Any] = []
        self.on_request = on_request or {}  # extra operations this side serves: op -> fn(*args)
        self.watch = watch  # runs a call under an op watch: call -> (result, ops); the kernel's side

    # -- lending
    def lend(self, value) -> int:
        if not self.lends_freely and not _lendable(value):
            raise WireError(f"the checker does not lend {type(value).__name__} objects")
        self.lent.append(value)
        return len(self.lent) - 1

    def lent_object(self, handle: int):
        if not 0 <= handle < len(self.lent):
            raise WireError(f"no object {handle} was lent")
        return self.lent[handle]

    # -- framing
    def send(self, header: dict, buffers: list[bytes]) -> None:
        body = json.dumps(header, allow_nan=False).encode()
        payload = b"".join(struct.pack("<Q", len(b)) + b for b in buffers)
        self.sock.sendall(HEADER.pack(len(body), len(payload)) + body + payload)

    def _read(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise WireError("the other side hung up")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def receive(self):
        head, size = HEADER.unpack(self._read(HEADER.size))
        if head + size > MAX_MESSAGE_BYTES:
            raise WireError(f"a message of {head + size} bytes is over the limit")
        header = json.loads(self._read(head))
        payload, buffers, at = memoryview(self._read(size)), [], 0
        while at < len(payload):
            (length,) = struct.unpack_from("<Q", payload, at)
            buffers.append(payload[at + 8 : at + 8 + length])
            at += 8 + length
        return header, Decoder(self, buffers)

    def _encode(self, value):
        encoder = Encoder(self.lend)
        return encoder.encode(value), encoder.buffers

    # -- asking, and answering while waiting
    def request(self, op: str, *args):
        """Send one request and serve the other side's requests until its answer comes. A call made
        inside an active op watch (checks.OpWatch) runs watched over there, and its ops are added
        here; nothing this side does on the wire is recorded as the other side's ops."""
        watches = [mode for mode in _get_current_dispatch_mode_stack() if hasattr(mode, "add_remote_ops")]
        if watches and op == "call_method":
            op = "call_watched"
        with _disable_current_modes():
            body, buffers = self._encode(list(args))
            self.send({"op": op, "args": body}, buffers)
            answer = self.serve_until_answer(args)
        if op == "call_watched":
            answer, ops = answer
            for watch in watches:
                watch.add_remote_ops(ops)
        return answer

    def serve_until_answer(self, sent_args=()):
        while True:
            header, decoder = self.receive()
            if "op" in header:
                self._answer(header, decoder)
                continue
            if header.get("done"):
                return None
            if "error" in header:
                error = header["error"]
                raise remote_exception(str(error.get("type", "Exception"))[:80], str(error.get("message", ""))[:2000])
            result = decoder.decode(header["result"])
            if header.get("mutated"):
                self._apply_mutations(sent_args, decoder.decode(header["mutated"]))
            return result

    @staticmethod
    def _apply_mutations(sent_args, mutated) -> None:
        """`mutated`: [index in the call's args or kwarg name, new value] for its mutable arguments;
        `sent_args`: the request's (handle, method, args, kwargs)."""
        call_args = sent_args[2] if len(sent_args) > 2 else []
        call_kwargs = sent_args[3] if len(sent_args) > 3 else {}
        for where, value in mutated or []:
            original = call_args[where] if isinstance(where, int) and where < len(call_args) else call_kwargs.get(where)
            update_in_place(original, value)

    def _answer(self, header: dict, decoder: Decoder) -> None:
        op = header["op"]
        try:
            args = decoder.decode(header["args"])
            mutated = []
            if op == "getattr":
                result = self._getattr(self.lent_object(int(args[0])), str(args[1]))
            elif op in ("call_method", "call_watched"):
                handle, method, call_args, call_kwargs = int(args[0]), str(args[1]), list(args[2]), dict(args[3])
                target = self.lent_object(handle)

                def call():
                    return self._call_method(target, method, call_args, call_kwargs)

                if op == "call_watched" and self.watch is None:
                    raise WireError("this side runs no watched calls")
                result = self.watch(call) if op == "call_watched" else call()
                mutated = [[i, a] for i, a in enumerate(call_args) if isinstance(a, MUTABLE)]
                mutated += [[k, a] for k, a in call_kwargs.items() if isinstance(a, MUTABLE)]
            elif op in self.on_request:
                result = self.on_request[op](*args)
            else:
                raise WireError(f"unknown request {op!r}")
            encoder = Encoder(self.lend)
            reply = {"result": encoder.encode(result), "mutated": encoder.encode(mutated)}
            self.send(reply, encoder.buffers)
        except WireError:
            raise
        except Exception as error:  # the caller's problem: it is raised over there
            self.send({"error": {"type": type(error).__name__, "message": str(error)}}, [])

    def _getattr(self, target, name: str):
        if not self.lends_freely and name.startswith("_"):
            raise AttributeError(f"the checker does not share {name!r}")
        return getattr(target, name)

    def _call_method(self, target, method: str, args: list, kwargs: dict):
        if method not in CONTAINER_METHODS:
            raise WireError(f"{method!r} is not a call the boundary carries")
        if method == "__call__":
            return target(*args, **kwargs)
        if method == "__iter__":
            return list(target)
        return getattr(type(target), method)(target, *args, **kwargs)
