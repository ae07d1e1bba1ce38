"""An AsyncAPI 3.0 document of an app's listeners (`ackkit docs`).

Channels: every listener's queue, the exchange bindings that feed it (one
channel per exchange and routing key), its dead-letter queue and its retry
delay queues, and where its handler publishes (`publishes=`). Operations: the
app receives from each listener's queue, sends copies to its dead-letter and
retry queues, and sends what each listener declares it publishes. Messages:
the payload schema comes from the handler's annotation, or a `Publication`'s
`payload` (a pydantic model's JSON schema, any other type pydantic validates,
bytes, text or any JSON). AMQP channel and operation bindings follow the
AsyncAPI AMQP bindings 0.3.0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, TypeAdapter

from .._connection.url import mask_url
from .._core import headers as H
from .._core.exchanges import Exchange
from .._core.policy import RetryStrategy
from .listener_spec import ListenerSpec
from .listener_values import Publication

ASYNCAPI = "3.0.0"
AMQP_BINDINGS = "0.3.0"
_ID = re.compile(r"[^A-Za-z0-9_.\-]")


def _key(text: str) -> str:
    """A component / channel key: the AsyncAPI key pattern is ^[a-zA-Z0-9\\.\\-_]+$."""
    return _ID.sub("_", text) or "_"


def payload_schema(spec: ListenerSpec) -> tuple[dict[str, Any], str | None]:
    """(JSON schema of the body, content type) from the handler's first parameter."""
    return _schema(spec.binding.kind, spec.binding.model)


def publication_schema(p: Publication) -> tuple[dict[str, Any], str | None]:
    """(JSON schema of the body, content type) of a `Publication`'s payload type."""
    t = p.payload
    if t is None or t is dict or t is list:
        return _schema("json", t)
    if t is bytes or t is str:
        return _schema("bytes" if t is bytes else "text", t)
    if isinstance(t, type) and issubclass(t, BaseModel):
        return _schema("model", t)
    return _schema("adapter", TypeAdapter(t))


def _schema(kind: str, model: Any) -> tuple[dict[str, Any], str | None]:
    if kind == "model" and isinstance(model, type) and issubclass(model, BaseModel):
        return model.model_json_schema(ref_template="#/components/schemas/{model}"), (
            "application/json"
        )
    if kind == "adapter" and isinstance(model, TypeAdapter):
        try:
            return model.json_schema(ref_template="#/components/schemas/{model}"), (
                "application/json"
            )
        except Exception:  # a type without a JSON schema
            return {}, "application/json"
    if kind == "json":
        if model is dict:
            return {"type": "object"}, "application/json"
        if model is list:
            return {"type": "array"}, "application/json"
        return {}, "application/json"
    if kind == "text":
        return {"type": "string"}, "text/plain"
    if kind == "bytes":
        return {"type": "string", "format": "binary"}, "application/octet-stream"
    return {}, None  # the handler reads the Delivery itself


def _lift_defs(schema: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    """Move pydantic's `$defs` into components/schemas (where its $refs point)."""
    defs = schema.pop("$defs", None) or {}
    for name, d in defs.items():
        schemas.setdefault(name, d)
    return schema


def _vhost(url: str) -> str:
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def _queue_binding(name: str, vhost: str) -> dict[str, Any]:
    return {
        "amqp": {
            "is": "queue",
            "queue": {
                "name": name,
                "durable": True,
                "exclusive": False,
                "autoDelete": False,
                "vhost": vhost,
            },
            "bindingVersion": AMQP_BINDINGS,
        }
    }


def _exchange_binding(e: Exchange | str, vhost: str) -> dict[str, Any]:
    ex: dict[str, Any] = {"name": e if isinstance(e, str) else e.name, "vhost": vhost}
    if isinstance(e, Exchange):
        ex.update(type=e.type.value, durable=e.durable, autoDelete=e.auto_delete)
    else:
        ex.update(type="topic", durable=True, autoDelete=False)
    return {"amqp": {"is": "routingKey", "exchange": ex, "bindingVersion": AMQP_BINDINGS}}


def _publication(
    spec: ListenerSpec,
    p: Publication,
    vhost: str,
    channels: dict[str, Any],
    messages: dict[str, Any],
    schemas: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    """Add `p`'s channel (shared with a listener's queue or binding of the same address)
    and message; its send operation (key, operation)."""
    ex, rk = p.exchange_name, p.routing_key
    where = f"exchange {ex!r} with routing key {rk!r}" if ex else f"queue {rk!r}"
    if ex:
        ch_key = _key(f"{ex}.{rk or '#'}")
        fresh = {
            "address": rk or None,
            "messages": {},
            "description": f"Messages published to exchange {ex!r}"
            + (f" with routing key {rk!r}" if rk else ""),
            "bindings": _exchange_binding(p.exchange, vhost),
        }
    else:  # the default exchange: the routing key names the queue
        ch_key = _key(rk)
        fresh = {"address": rk, "messages": {}, "bindings": _queue_binding(rk, vhost)}
    ch = channels.setdefault(ch_key, fresh)
    schema, content_type = publication_schema(p)
    msg_key = _key(f"{spec.name}.sends.{ex or 'default'}.{rk}")
    message: dict[str, Any] = {
        "name": msg_key,
        "payload": _lift_defs(schema, schemas),
        "summary": f"Published by {spec.name} to {where}.",
    }
    if content_type:
        message["contentType"] = content_type
    if isinstance(p.payload, type):
        message["title"] = p.payload.__name__
    messages[msg_key] = message
    ch["messages"][msg_key] = {"$ref": f"#/components/messages/{msg_key}"}
    op = {
        "action": "send",
        "channel": {"$ref": f"#/channels/{ch_key}"},
        "messages": [{"$ref": f"#/channels/{ch_key}/messages/{msg_key}"}],
        "summary": f"{spec.name} publishes to {where}",
    }
    return _key(f"send.{spec.name}.{ex or 'default'}.{rk}"), op


DEAD_LETTER_HEADERS = {
    "type": "object",
    "description": "Headers ackkit adds to a dead letter (the original headers are kept).",
    "properties": {
        H.REASON: {"type": "string", "description": "Why it was dead-lettered."},
        H.ERROR_TYPE: {"type": "string", "description": "The handler's exception type."},
        H.ERROR_MESSAGE: {"type": "string"},
        H.ERROR_TRACEBACK: {"type": "string"},
        H.ATTEMPTS: {"type": "integer", "description": "Attempts made."},
        H.ORIGINAL_QUEUE: {"type": "string"},
        H.DEAD_LETTERED_AT: {"type": "string", "format": "date-time"},
    },
}


class Documented(Protocol):
    """What `document` reads of an app (spec.AppBase): its URL and its listeners."""

    @property
    def url(self) -> str:
        """The (first) broker URL the app connects to."""
        ...

    @property
    def specs(self) -> Sequence[ListenerSpec]:
        """The app's registered listeners."""
        ...


def document(
    app: Documented, *, title: str = "ackkit app", version: str = "1.0.0"
) -> dict[str, Any]:
    """The AsyncAPI 3.0 document (a JSON-ready dict) of `app`'s registered listeners."""
    vhost = _vhost(app.url)
    u = urlsplit(app.url)
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for spec in app.specs:
        schema, content_type = payload_schema(spec)
        schema = _lift_defs(schema, schemas)
        msg_key = _key(f"{spec.name}.message")
        message: dict[str, Any] = {"name": msg_key, "payload": schema}
        if content_type:
            message["contentType"] = content_type
        doc = (spec.binding.fn.__doc__ or "").strip()
        if doc:
            message["description"] = doc
        messages[msg_key] = message
        ref = {"$ref": f"#/components/messages/{msg_key}"}
        q_key = _key(spec.queue)
        channels[q_key] = {
            "address": spec.queue,
            "messages": {msg_key: ref},
            "bindings": _queue_binding(spec.queue, vhost),
        }
        fed_by = []
        for b in spec.binds:
            ch_key = _key(f"{b.exchange_name}.{b.routing_key or '#'}")
            ch = channels.setdefault(
                ch_key,
                {
                    "address": b.routing_key or None,
                    "messages": {},
                    "description": f"Messages published to exchange {b.exchange_name!r}"
                    + (f" with routing key {b.routing_key!r}" if b.routing_key else ""),
                    "bindings": _exchange_binding(b.exchange, vhost),
                },
            )
            ch["messages"][msg_key] = ref
            fed_by.append({"$ref": f"#/channels/{ch_key}"})
        if fed_by:
            channels[q_key]["x-bound-to"] = fed_by
        op_key = _key(f"receive.{spec.name}")
        operations[op_key] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{q_key}"},
            "messages": [{"$ref": f"#/channels/{q_key}/messages/{msg_key}"}],
            "summary": f"{spec.name} ({spec.policy.mode.value} ack, prefetch "
            f"{spec.policy.prefetch}, {spec.policy.retry.max_attempts} attempt(s))",
            "bindings": {
                "amqp": {"ack": spec.policy.mode.value != "none", "bindingVersion": AMQP_BINDINGS}
            },
        }
        for purpose, name in _copies(spec):
            c_key = _key(name)
            copy_key = _key(f"{spec.name}.{purpose}")
            cm: dict[str, Any] = {"name": copy_key, "payload": schema}
            if content_type:
                cm["contentType"] = content_type
            if purpose == "deadLetter":
                cm["headers"] = DEAD_LETTER_HEADERS
                cm["description"] = "A message given up on, with why (see headers)."
            else:
                cm["description"] = "A copy waiting for its retry (TTL), then sent back."
            messages[copy_key] = cm
            channels[c_key] = {
                "address": name,
                "messages": {copy_key: {"$ref": f"#/components/messages/{copy_key}"}},
                "bindings": _queue_binding(name, vhost),
            }
            operations[_key(f"{purpose}.{spec.name}.{name}")] = {
                "action": "send",
                "channel": {"$ref": f"#/channels/{c_key}"},
                "messages": [{"$ref": f"#/channels/{c_key}/messages/{copy_key}"}],
            }
    for spec in app.specs:  # after every listener's own channels: they share them
        for p in spec.publishes:
            key, op = _publication(spec, p, vhost, channels, messages, schemas)
            operations[key] = op
    default_port = 5671 if u.scheme == "amqps" else 5672
    out: dict[str, Any] = {
        "asyncapi": ASYNCAPI,
        "info": {
            "title": title,
            "version": version,
            "description": f"Listeners of {type(app).__name__} on {mask_url(app.url)}, "
            "documented by ackkit.",
        },
        "servers": {
            "rabbitmq": {
                "host": f"{u.hostname or 'localhost'}:{u.port or default_port}",
                "protocol": "amqps" if u.scheme == "amqps" else "amqp",
                "pathname": vhost if vhost.startswith("/") else "/" + vhost,
            }
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }
    return out


def _copies(spec: ListenerSpec) -> Iterable[tuple[str, str]]:
    p = spec.policy
    if p.dead_letter_queue is not None:
        yield "deadLetter", p.dead_letter_queue
    if p.retry.strategy is RetryStrategy.BROKER and p.retry.max_attempts > 1:
        for ms in p.retry.delay_tiers_ms():
            yield "retry", p.delay_queue(ms)


def to_yaml(data: Any, indent: int = 0) -> str:
    """YAML for JSON-like data (dicts, lists, str, numbers, bools, None): block style,
    every string double-quoted as JSON writes it (a JSON string is a YAML one)."""
    pad = "  " * indent
    if isinstance(data, dict):
        if not data:
            return "{}"
        lines = []
        for k, v in data.items():
            key = json.dumps(str(k))
            if isinstance(v, dict | list) and v:
                lines.append(f"{pad}{key}:\n{to_yaml(v, indent + 1)}")
            else:
                lines.append(f"{pad}{key}: {to_yaml(v)}")
        return "\n".join(lines)
    if isinstance(data, list):
        if not data:
            return "[]"
        lines = []
        for v in data:
            if isinstance(v, dict | list) and v:
                inner = to_yaml(v, indent + 1).lstrip()
                lines.append(f"{pad}- {inner}")
            else:
                lines.append(f"{pad}- {to_yaml(v)}")
        return "\n".join(lines)
    if isinstance(data, float):
        # YAML 1.1 readers (PyYAML) take a float only with a dot and a signed exponent.
        text = repr(data)
        mant, e, exp = text.partition("e")
        if "." not in mant:
            mant += ".0"
        if e and exp[0] not in "+-":
            exp = "+" + exp
        return mant + e + exp
    return json.dumps(data, ensure_ascii=True)
