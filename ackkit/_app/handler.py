"""Binding a user's handler to deliveries: what it takes, how bodies are decoded."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from .._core.errors import BadPayload
from .._core.outcome import AckIndex
from .._messages.delivery import (
    TOO_DEEP,
    DeliveryBase,
    _adapter_reason,
    _validation_reason,
    decode_json,
)

__all__ = ["AckIndex", "Binding", "Decoder"]

DEFAULT_MAX_BODY = 16 * 1024 * 1024
_JSON_TYPES = ("application/json", "text/json")


@dataclass(frozen=True, slots=True)
class Decoder:
    """Checks a body before parsing: size limit and content type."""

    max_body_size: int = DEFAULT_MAX_BODY
    check_content_type: bool = True

    def check(self, d: DeliveryBase) -> None:
        n = len(d.body)
        if n > self.max_body_size:
            raise BadPayload(f"body of {n} bytes exceeds max_body_size={self.max_body_size}")
        if n == 0:
            raise BadPayload("empty body")
        if self.check_content_type:
            ct = d.content_type
            if ct:
                base = ct.split(";", 1)[0].strip().lower()
                if base not in _JSON_TYPES and not base.endswith("+json"):
                    raise BadPayload(f"content-type {ct!r} is not JSON")
            enc = getattr(d.properties, "content_encoding", None)
            if enc and enc.lower() not in ("utf-8", "utf8", "identity"):
                raise BadPayload(f"content-encoding {enc!r} is not supported")


class Binding:
    """How to call one handler: which argument comes from the delivery, and how.

    The first parameter decides: unannotated or annotated `Delivery`, the delivery
    itself; `bytes` / `str`, the raw body / its UTF-8 text; a pydantic model, `dict`,
    `list`, `Any` or any other type pydantic validates, the JSON body decoded for it;
    `list[X]` (or `Sequence[X]`), a batch of those. A second parameter, unannotated or
    annotated `Delivery`, receives the delivery (a batch handler's: the list of them).
    """

    __slots__ = ("batch", "decoder", "fn", "is_async", "kind", "model", "name", "pass_delivery")

    def __init__(self, fn: Callable[..., Any], decoder: Decoder, name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"a handler must be callable, got {fn!r} ({type(fn).__name__})")
        self.fn = fn
        self.decoder = decoder
        self.name = name or getattr(fn, "__qualname__", repr(fn))
        self.is_async = is_coroutine_callable(fn)
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"handler {self.name}: cannot read its signature ({exc})") from None
        params = list(sig.parameters.values())
        try:
            hints = typing.get_type_hints(annotated(fn))
        except Exception as exc:  # an annotation names something not importable here
            raise TypeError(
                f"handler {self.name}: cannot resolve its annotations ({exc}). With "
                "'from __future__ import annotations' every type a handler names must be "
                "importable at module level, not only inside a function."
            ) from None
        self.batch = False
        self.kind = "none"
        self.model: Any = None
        self.pass_delivery = False
        positional = [p for p in params if p.kind in _POSITIONAL]
        for p in params:
            if p.kind is p.KEYWORD_ONLY and p.default is p.empty:
                raise TypeError(
                    f"handler {self.name}: keyword-only parameter {p.name!r} has no default; "
                    "ackkit passes at most the body and the delivery, positionally"
                )
        if not positional:
            return
        first = positional[0]
        tp = hints.get(first.name, inspect.Parameter.empty)
        origin = get_origin(tp)
        if origin in (list, Sequence, typing.Sequence, tuple) and get_args(tp):
            self.batch = True
            tp = get_args(tp)[0]
        self.kind, self.model = _classify(tp)
        if first.kind is first.VAR_POSITIONAL:
            return
        if len(positional) > 1:
            second = positional[1]
            tp2 = hints.get(second.name, inspect.Parameter.empty)
            wants = second.kind is not second.VAR_POSITIONAL and second.default is second.empty
            if get_origin(tp2) in (list, Sequence, typing.Sequence, tuple) and get_args(tp2):
                tp2 = get_args(tp2)[0]  # a batch handler's deliveries
            if _is_delivery(tp2) or (wants and tp2 is inspect.Parameter.empty):
                self.pass_delivery = True
            elif wants:
                raise TypeError(
                    f"handler {self.name}: the second parameter {second.name!r} is annotated "
                    f"{tp2!r}; it can only receive the Delivery (annotate it `Delivery` or "
                    "leave it unannotated)"
                )
            rest = [p for p in positional[2:] if p.default is p.empty]
            rest = [p for p in rest if p.kind is not p.VAR_POSITIONAL]
            if rest:
                raise TypeError(
                    f"handler {self.name}: parameter {rest[0].name!r} would receive nothing; "
                    "a handler takes the body (or the Delivery) and optionally the Delivery"
                )

    @property
    def gets_delivery(self) -> bool:
        """Whether the handler receives its Delivery (so it can settle it)."""
        return self.kind == "delivery" or self.pass_delivery

    def arg(self, d: DeliveryBase) -> Any:
        """The first argument for delivery d; raises BadPayload when it cannot be decoded."""
        kind = self.kind
        if kind == "delivery":
            return d
        if kind == "none":
            return None
        if kind in ("bytes", "text"):
            # Not JSON, so no content-type check; the size limit holds for every body.
            n, limit = len(d.body), self.decoder.max_body_size
            if n > limit:
                raise BadPayload(f"body of {n} bytes exceeds max_body_size={limit}")
            return d.body if kind == "bytes" else d.text()
        self.decoder.check(d)
        if kind in ("model", "adapter"):  # pydantic: a BaseModel, or a TypeAdapter
            model = self.model
            validate = model.model_validate_json if kind == "model" else model.validate_json
            try:
                return validate(d.body)
            except ValidationError as exc:
                reason = _validation_reason if kind == "model" else _adapter_reason
                raise BadPayload(reason(model, exc)) from None
            except RecursionError:
                raise BadPayload(TOO_DEEP) from None
        value = decode_json(d.body)
        if self.model is not None and not isinstance(value, self.model):
            raise BadPayload(
                f"body is a JSON {type(value).__name__}, the handler takes a {self.model.__name__}"
            )
        return value

    def args(self, d: DeliveryBase) -> tuple[Any, ...]:
        if self.kind == "none":
            return (d,) if self.pass_delivery else ()
        a = self.arg(d)
        return (a, d) if self.pass_delivery else (a,)


_POSITIONAL = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.VAR_POSITIONAL,
)


def is_coroutine_callable(fn: object) -> bool:
    """True for an `async def` function, a method, an object whose `__call__` is one,
    or a functools.partial of any of these."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    if inspect.isroutine(fn) or isinstance(fn, type):
        return False
    return inspect.iscoroutinefunction(_call_of(fn))


def annotated(fn: Any) -> Any:
    """What carries the annotations of `fn`'s parameters (a partial's function, an
    object's __call__)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isroutine(fn) or isinstance(fn, type):
        return fn
    call = _call_of(fn)
    return call if call is not None else fn


def _call_of(obj: object) -> Any:
    """The __call__ function of a callable object's class."""
    return inspect.getattr_static(type(obj), "__call__", None)


def _is_delivery(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, DeliveryBase)


def _classify(tp: Any) -> tuple[str, Any]:
    if tp is inspect.Parameter.empty or _is_delivery(tp):
        return "delivery", None
    if tp is Any:
        return "json", None
    if tp is bytes:
        return "bytes", None
    if tp is str:
        return "text", None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "model", tp
    if tp in (dict, list):
        return "json", tp  # the JSON value must be that container; dict[K, V]: pydantic
    return "adapter", TypeAdapter(tp)
