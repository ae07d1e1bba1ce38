"""Binding a user's handler to deliveries: what it takes, how bodies are decoded."""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from ._core.errors import BadPayload
from ._core.outcome import AckIndex
from ._delivery import Delivery, _validation_reason

__all__ = ["AckIndex", "Binding", "Decoder"]

DEFAULT_MAX_BODY = 16 * 1024 * 1024
_JSON_TYPES = ("application/json", "text/json")


@dataclass(frozen=True, slots=True)
class Decoder:
    """Checks a body before parsing: size limit and content type."""

    max_body_size: int = DEFAULT_MAX_BODY
    check_content_type: bool = True

    def check(self, d: Delivery) -> None:
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
    """How to call one handler: which argument comes from the delivery, and how."""

    __slots__ = ("batch", "decoder", "fn", "is_async", "kind", "model", "name", "pass_delivery")

    def __init__(self, fn: Callable[..., Any], decoder: Decoder, name: str | None = None) -> None:
        self.fn = fn
        self.decoder = decoder
        self.name = name or getattr(fn, "__qualname__", repr(fn))
        self.is_async = inspect.iscoroutinefunction(fn)
        params = list(inspect.signature(fn).parameters.values())
        try:
            hints = typing.get_type_hints(fn)
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
        if not params:
            return
        first = hints.get(params[0].name, inspect.Parameter.empty)
        origin = get_origin(first)
        if origin in (list, Sequence, typing.Sequence, tuple) and get_args(first):
            self.batch = True
            first = get_args(first)[0]
        self.kind, self.model = _classify(first)
        if len(params) > 1:
            second = hints.get(params[1].name, inspect.Parameter.empty)
            if _is_delivery(second):
                self.pass_delivery = True
            elif params[1].default is inspect.Parameter.empty:
                raise TypeError(
                    f"handler {self.name}: the second parameter must be a Delivery (got {second!r})"
                )

    def arg(self, d: Delivery) -> Any:
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
        if kind == "model":
            try:
                return self.model.model_validate_json(d.body)
            except ValidationError as exc:
                raise BadPayload(_validation_reason(self.model, exc)) from None
        if kind == "adapter":
            try:
                return self.model.validate_json(d.body)
            except ValidationError as exc:
                raise BadPayload(f"does not match {self.model!r}: {exc.errors()[:3]}") from None
        try:
            return json.loads(d.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadPayload(f"body is not valid JSON: {exc}") from None

    def args(self, d: Delivery) -> tuple[Any, ...]:
        if self.kind == "none":
            return (d,) if self.pass_delivery else ()
        a = self.arg(d)
        return (a, d) if self.pass_delivery else (a,)


def _is_delivery(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Delivery)


def _classify(tp: Any) -> tuple[str, Any]:
    if tp is inspect.Parameter.empty or tp is Any:
        return "json", None
    if _is_delivery(tp):
        return "delivery", None
    if tp is bytes:
        return "bytes", None
    if tp is str:
        return "text", None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "model", tp
    if tp in (dict, list) or get_origin(tp) in (dict, list):
        return "json", None
    return "adapter", TypeAdapter(tp)
