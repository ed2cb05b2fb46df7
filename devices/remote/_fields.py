"""The REMOTE protocol's field codecs and the machinery its messages are declared with.

wire.py declares every message as a NamedTuple and the check of each of its fields, in
wire order (`message`, `entry`); this module holds those checks (each names the field
and the rule it broke in a `WireError`), the field types shared by many messages (a
buffer reference, `Ref`), the tables the declarations fill, and what reads and writes a
message by them: `decode` and `decode_entry` (a received [kind, *fields], every field
checked, optional fields at the end put back at their defaults) and `as_meta` (a
message as it goes on the wire, less those defaults). Import them from wire.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

# The dtypes a buffer may have on the wire, as numpy writes them with their byte order
# (`np.dtype(...).str`): bool, int, uint, float and complex types of fixed size.
DTYPES = frozenset(
    ["|b1", "|i1", "|u1"]
    + [
        f"{order}{kind}{size}"
        for order in "<>"
        for kind, sizes in (("i", "248"), ("u", "248"), ("f", "248"), ("c", ("8", "16")))
        for size in sizes
    ]
)
DTYPES_TEXT = (
    "a bool, int, uint, float or complex dtype written with its byte order, as numpy's "
    "dtype.str writes it ('<i4', '>f8', '|u1', ...)"
)

ID_MAX = (1 << 63) - 1  # ids, handles, sizes
VALUE_MAX = 1 << 62  # a base or value a client sends
REL_MAX = 1 << 40  # a value a program names, relative to its slot's base
SLOT_MAX = 1 << 16  # a base slot a program names


class WireError(Exception):
    """A frame or a message broke the protocol (bad header, bad msgpack, bad field)."""


# -- field checks: each names the field and the rule it broke --


def want_int(value: object, what: str, lo: int = 0, hi: int = ID_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{what} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise WireError(f"{what} = {value} is outside {lo}..{hi}")
    return value


def want_str(value: object, what: str, max_len: int = 256) -> str:
    if not isinstance(value, str) or len(value) > max_len:
        raise WireError(f"{what} must be a str of at most {max_len} chars")
    return value


def want_bytes(value: object, what: str, max_len: int = 256) -> bytes:
    if not isinstance(value, bytes) or len(value) > max_len:
        raise WireError(f"{what} must be bytes of at most {max_len}")
    return value


def want_list(
    value: object, what: str, max_len: int = 1 << 20, size: int | None = None
) -> list[Any]:
    if not isinstance(value, list) or len(value) > max_len:
        raise WireError(f"{what} must be a list of at most {max_len} entries")
    if size is not None and len(value) != size:
        raise WireError(f"{what} must have {size} entries, got {len(value)}")
    return value


# A field's check: (value, its label) -> the value as the message holds it.
Check = Callable[[Any, str], Any]


class Integer:
    """The check of an int in lo..hi. `_decode` runs it inline (no call per field), as
    does `IntList` for each entry: most fields of the messages sent per replay are ints."""

    __slots__ = ("hi", "lo")

    def __init__(self, lo: int, hi: int) -> None:
        self.lo = lo
        self.hi = hi

    def __call__(self, value: Any, what: str) -> int:
        return want_int(value, what, self.lo, self.hi)


def integer(lo: int = 0, hi: int = ID_MAX) -> Integer:
    return Integer(lo, hi)


def text(max_len: int = 256) -> Check:
    return lambda value, what: want_str(value, what, max_len)


def blob(max_len: int) -> Check:
    return lambda value, what: want_bytes(value, what, max_len)


class IntList:
    """The check of a list of ints in lo..hi (each named `item` in an error): one loop,
    no call per entry."""

    __slots__ = ("hi", "item", "lo", "max_len", "size")

    def __init__(self, item: str, check: Integer, max_len: int, size: int | None) -> None:
        self.item = item
        self.lo = check.lo
        self.hi = check.hi
        self.max_len = max_len
        self.size = size

    def __call__(self, value: Any, what: str) -> list[int]:
        want_list(value, what, self.max_len, self.size)
        lo, hi = self.lo, self.hi
        for entry in value:
            if type(entry) is not int or not lo <= entry <= hi:
                want_int(entry, self.item, lo, hi)  # raises (or passes an int subclass)
        return value  # type: ignore[no-any-return]


def list_of(item: str, check: Check, max_len: int, size: int | None = None) -> Check:
    """A list whose entries pass `check` (each named `item` in an error)."""
    if type(check) is Integer:
        return IntList(item, check, max_len, size)

    def checked(value: Any, what: str) -> list[Any]:
        return [check(entry, item) for entry in want_list(value, what, max_len, size)]

    return checked


class Optional:
    """The check of None, or of what passes `check` (a message's decoder lets None
    through inline)."""

    __slots__ = ("check",)

    def __init__(self, check: Check) -> None:
        self.check = check

    def __call__(self, value: Any, what: str) -> Any:
        return None if value is None else self.check(value, what)


def optional(check: Check) -> Optional:
    return Optional(check)


def anything(value: Any, what: str) -> Any:
    """A field checked where it is used (a program's entries, as they are lowered)."""
    return value


def flag(value: Any, what: str) -> bool:
    """msgpack's true, and anything else as false (a field that only says yes)."""
    return value is True


def seconds(value: Any, what: str) -> float:
    """A time on a clock of the sender's, in seconds: a finite float."""
    if type(value) is not float or not math.isfinite(value):
        raise WireError(f"{what} must be a finite float (seconds), got {value!r:.40}")
    return value


def spans(value: Any, what: str) -> list[tuple[int, float, float]]:
    """[[entry index, start, end], ...]: when each entry of a program ran or parked."""
    spans = []
    for span in want_list(value, what, 1 << 20):
        if type(span) is not list or len(span) != 3:
            want_list(span, "span", 3, size=3)
        index, start, end = span
        if type(index) is not int or not 0 <= index <= ID_MAX:
            want_int(index, "span entry index")
        if type(start) is not float or type(end) is not float:
            seconds(start, "span start")
            seconds(end, "span end")
        spans.append((index, start, end))
    return spans


class Ref(NamedTuple):
    """A buffer (view) of a client's: its allocation's handle, the offset and the shape
    of the view (no shape: the whole allocation), and the view's dtype when it is not
    its allocation's (one of DTYPES; "": the allocation's). The offset counts elements
    of the view's dtype from the allocation's start. On the wire: [handle, offset,
    shape] or [handle, offset, shape, dtype]."""

    handle: int
    offset: int
    shape: tuple[int, ...]
    dtype: str = ""


def ref(value: Any, what: str) -> Ref:
    """The Ref `value` writes on the wire (see Ref), its fields checked in one pass;
    raises WireError naming the field (`what`) and the rule it broke."""
    if type(value) is list and 3 <= len(value) <= 4:
        handle, offset, shape = value[:3]
        dtype = value[3] if len(value) == 4 else ""
        if (
            type(handle) is int
            and 0 <= handle <= ID_MAX
            and type(offset) is int
            and 0 <= offset <= ID_MAX
            and _is_shape(shape)
            and (dtype == "" or (type(dtype) is str and dtype in DTYPES))
        ):
            return tuple.__new__(Ref, (handle, offset, tuple(shape), dtype))
    return _checked_ref(value, what)


def _is_shape(shape: Any) -> bool:
    """Whether `shape` is a Ref's shape as the wire writes it: a list of at most 8 ids."""
    if type(shape) is not list or len(shape) > 8:
        return False
    for dim in shape:
        if type(dim) is not int or not 0 <= dim <= ID_MAX:
            return False
    return True


def _checked_ref(value: Any, what: str) -> Ref:
    """`ref` for a value its one pass refused: each field checked on its own, so the
    WireError raised says which is wrong and why."""
    fields = want_list(value, what, 4, size=4 if type(value) is list and len(value) > 3 else 3)
    dims = want_list(fields[2], f"{what} shape", 8)
    dtype = fields[3] if len(fields) == 4 else ""
    if dtype != "" and (type(dtype) is not str or dtype not in DTYPES):
        raise WireError(f"{what} dtype is {dtype!r}, not {DTYPES_TEXT}")
    return Ref(
        want_int(fields[0], f"{what} handle"),
        want_int(fields[1], f"{what} offset"),
        tuple(want_int(d, f"{what} shape") for d in dims),
        dtype,
    )


def pairs(value: Any, what: str) -> list[tuple[int, int]]:
    """[[mirror id, value], ...]: mirrored signals' new values (one loop, as IntList)."""
    pairs = []
    for pair in want_list(value, what, 1 << 16):
        if type(pair) is not list or len(pair) != 2:
            want_list(pair, "ext entry", 2, size=2)
        mirror, ext = pair
        if type(mirror) is not int or not 0 <= mirror <= ID_MAX:
            want_int(mirror, "signal id")
        if type(ext) is not int or not 0 <= ext <= VALUE_MAX:
            want_int(ext, "ext value", 0, VALUE_MAX)
        pairs.append((mirror, ext))
    return pairs


# -- declaring messages --

M = TypeVar("M", bound=type)

# A message's decoder: from the received [kind, *fields], every field there, the message.
Decoder = Callable[[list[Any]], Any]
# kind -> (its decoder, how many fields are required, how many there are, and per count
# of fields sent from `required` on, the defaults of those left out)
_Schema = tuple[Decoder, int, int, tuple[list[Any], ...]]
_MESSAGES: dict[str, _Schema] = {}
_ENTRIES: dict[str, _Schema] = {}
_KINDS: dict[type, str] = {}
# A message class -> (its kind, its length on the wire with no optional field, the
# defaults of its optional fields): what `as_meta` writes.
_WRITE: dict[type, tuple[str, int, tuple[Any, ...]]] = {}


def _field_code(index: int, check: Check, names: dict[str, Any]) -> str:
    """The decoder's line for field `index` (in `f{index}`): an Integer's range, an
    Optional's None and a flag are checked inline; any other value goes through the
    check, as does an int out of range (the check raises, naming the field)."""
    call = f"f{index} = _check{index}(f{index}, _label{index})"
    if check is flag:
        return f"    f{index} = f{index} is True"
    if type(check) is Integer:
        return (
            f"    if type(f{index}) is not int or not {check.lo} <= f{index} <= {check.hi}: {call}"
        )
    if type(check) is Optional:
        names[f"_check{index}"] = check.check
        return f"    if f{index} is not None: {call}"
    return f"    {call}"


def _decoder(cls: type, fields: tuple[tuple[str, Check], ...]) -> Decoder:
    """The decoder of a message class: checks each field and makes the message. It is
    written out once per class (as namedtuple writes a class's __new__), so a field
    in range costs a few bytecodes and no call, and the message is made in one."""
    names: dict[str, Any] = {"_new": tuple.__new__, "_cls": cls}
    values = ", ".join(f"f{i}" for i in range(1, len(fields) + 1))
    lines = ["def decode(meta):", f"    _, {values}, = meta"]
    for index, (label, check) in enumerate(fields, 1):
        names[f"_check{index}"] = check
        names[f"_label{index}"] = label
        lines.append(_field_code(index, check, names))
    lines.append(f"    return _new(_cls, ({values},))")
    exec("\n".join(lines), names)  # noqa: S102 (our own text: indices and int bounds)
    decoder: Decoder = names["decode"]
    return decoder


def _schema(table: dict[str, _Schema], kind: str, *fields: tuple[str, Check]) -> Callable[[M], M]:
    def register(cls: M) -> M:
        names: tuple[str, ...] = getattr(cls, "_fields")  # noqa: B009 (a NamedTuple's)
        defaults: dict[str, Any] = getattr(cls, "_field_defaults")  # noqa: B009
        assert len(fields) == len(names), (cls, fields)
        required = len(fields) - len(defaults)
        optional_defaults = tuple(defaults[name] for name in names[required:])
        pads = tuple(list(optional_defaults[sent:]) for sent in range(len(optional_defaults)))
        table[kind] = (_decoder(cls, fields), required, len(fields), pads)
        _KINDS[cls] = kind
        _WRITE[cls] = (kind, required + 1, optional_defaults)
        return cls

    return register


def message(kind: str, *fields: tuple[str, Check]) -> Callable[[M], M]:
    """Register a message class: its kind and each field's label and check, in order."""
    return _schema(_MESSAGES, kind, *fields)


def entry(kind: str, *fields: tuple[str, Check]) -> Callable[[M], M]:
    """Register a program entry class, as `message` does."""
    return _schema(_ENTRIES, kind, *fields)


# -- decoding and encoding --


def _decode(table: dict[str, _Schema], meta: Any, what: str) -> Any:
    if type(meta) is not list or not meta or type(meta[0]) is not str:
        raise WireError(f"a {what} is a list whose first field is its kind (a str)")
    kind = meta[0]
    schema = table.get(kind)
    if schema is None:
        raise WireError(f"unknown {what} {kind!r}")
    decoder, required, most, pads = schema
    count = len(meta) - 1
    if count != most:
        if not required <= count < most:
            wanted = required if required == most else f"{required} to {most}"
            raise WireError(f"message {kind!r} has {wanted} fields, got {count}")
        meta = meta + pads[count - required]  # optional fields left out: their defaults
    try:
        return decoder(meta)
    except WireError as exc:
        raise WireError(f"message {kind!r}: {exc}") from None


def decode(meta: Sequence[Any]) -> Any:
    """The message a received meta part holds ([kind, *fields]), every field checked."""
    return _decode(_MESSAGES, meta, "message")


def decode_entry(value: Any) -> Any:
    """A program entry, every field checked."""
    return _decode(_ENTRIES, value, "program entry")


def as_meta(message: Any) -> Any:
    """What goes on the wire for `message`: [kind, *fields], less the optional fields at
    its end that hold their defaults (the receiver puts the defaults back); anything that
    is not a message of this module goes as it is (a list made by hand, say)."""
    write = _WRITE.get(type(message))
    if write is None:
        return message
    kind, shortest, defaults = write
    meta = [kind, *message]
    if defaults:
        end = len(meta)
        while end > shortest and meta[end - 1] == defaults[end - 1 - shortest]:
            end -= 1
        del meta[end:]
    return meta


def kind_of(message_class: type) -> str:
    """The kind a message class is sent as."""
    return _KINDS[message_class]
