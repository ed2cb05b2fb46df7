"""DLPack capsules for device memory, built with ctypes (no compiled helper needed).

A capsule named "dltensor" holds a DLManagedTensor. The consumer (torch, cupy, jax,
numpy) renames it "used_dltensor" and calls the tensor's deleter when it is done; a
capsule nobody consumed calls the deleter from its own destructor. The deleter drops
the reference that kept the exporting allocation (and the ctypes structures) alive.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_Managed._fields_ = [
    ("dl_tensor", _Tensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    """DLPack 1.x: adds a version and flags (no READ_ONLY flag: consumers may write)."""

    _fields_ = [
        ("version", _Version),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _Tensor),
    ]


_NAME = b"dltensor"
_NAME_VERSIONED = b"dltensor_versioned"
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.Py_IncRef.argtypes = [ctypes.py_object]
_api.Py_DecRef.argtypes = [ctypes.c_void_p]

_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


class _Holder:
    """Keeps the exported memory and the ctypes structures alive for the consumer."""

    def __init__(self, owner: Any, shape: Sequence[int], versioned: bool) -> None:
        self.owner = owner
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.managed: Any = _ManagedVersioned() if versioned else _Managed()


def _release(struct: Any) -> None:
    holder = struct.manager_ctx
    if holder:
        struct.manager_ctx = None
        _api.Py_DecRef(holder)


def _delete(address: int | None) -> None:
    if address:
        _release(_Managed.from_address(address))


def _delete_versioned(address: int | None) -> None:
    if address:
        _release(_ManagedVersioned.from_address(address))


def _capsule_gone(capsule_address: int | None) -> None:
    # Called as the capsule dies: if nobody consumed it, release the tensor ourselves.
    if not capsule_address:
        return
    if _api.PyCapsule_IsValid(capsule_address, _NAME):
        _delete(_api.PyCapsule_GetPointer(capsule_address, _NAME))
    elif _api.PyCapsule_IsValid(capsule_address, _NAME_VERSIONED):
        _delete_versioned(_api.PyCapsule_GetPointer(capsule_address, _NAME_VERSIONED))


# Module-level so the C function pointers outlive every capsule.
_DELETE_FN = _DELETER(_delete)
_DELETE_VERSIONED_FN = _DELETER(_delete_versioned)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_capsule_gone)


def make_capsule(
    pointer: int,
    shape: Sequence[int],
    dtype: np.dtype[Any],
    device: tuple[int, int],
    owner: Any,
    max_version: tuple[int, int] | None = None,
) -> Any:
    """A capsule over `pointer` (C-contiguous `shape` of `dtype` on `device`): DLPack 1.0
    ("dltensor_versioned") when the consumer takes it, else the older "dltensor"."""
    code = _CODES.get(dtype.kind)
    if code is None:
        raise TypeError(f"dtype {dtype} has no DLPack type code")
    versioned = max_version is not None and tuple(max_version) >= (1, 0)
    holder = _Holder(owner, shape, versioned)
    tensor = holder.managed.dl_tensor
    tensor.data = pointer
    tensor.device = _Device(*device)
    tensor.ndim = len(shape)
    tensor.dtype = _DataType(code, dtype.itemsize * 8, 1)
    tensor.shape = ctypes.cast(holder.shape, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = ctypes.POINTER(ctypes.c_int64)()  # NULL: C-contiguous
    tensor.byte_offset = 0
    if versioned:
        holder.managed.version = _Version(1, 0)
        holder.managed.flags = 0
        holder.managed.deleter = _DELETE_VERSIONED_FN
    else:
        holder.managed.deleter = _DELETE_FN
    _api.Py_IncRef(holder)  # dropped by the deleter
    holder.managed.manager_ctx = id(holder)
    destructor = ctypes.cast(_CAPSULE_DESTRUCTOR, ctypes.c_void_p).value
    name = _NAME_VERSIONED if versioned else _NAME
    return _api.PyCapsule_New(ctypes.addressof(holder.managed), name, destructor)
