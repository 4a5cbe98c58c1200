"""Typed configs: the base class of every block of ``config.json``, the types their fields use, and
what is derived from them (the JSON Schema's nodes, the field kinds converters check sources against).

A config block is a pydantic v2 model (:class:`ConfigModel`), as in speculators 0.9
(``speculators/config.py``, ``models/eagle3/config.py``): fields with types, defaults and
descriptions, stated once. From those declarations come

* the JSON Schema published as ``schemas/config-v1.schema.json`` (:func:`model_node`,
  :class:`SchemaBuilder`; assembled by :mod:`specfmt.format.schema`);
* the field kinds a converter requires of a research config's fields (:func:`field_kinds`);
* the dicts the builders write (:meth:`ConfigModel.dump`: keys in the order they were given).

Types (``Annotated`` aliases; pydantic reads the ``annotated_types`` bounds, the schema builder reads
them and the markers below):

=================== ============================================ ==============================
alias               JSON Schema                                  kind (:func:`field_kinds`)
=================== ============================================ ==============================
``PositiveInt``     ``{"type": "integer", "minimum": 1}``        :data:`POSITIVE_INT`
``NonNegativeInt``  ``{"type": "integer", "minimum": 0}``        :data:`NON_NEGATIVE_INT`
``PositiveNumber``  ``{"type": "number", "exclusiveMinimum": 0}`` :data:`POSITIVE_REAL`
``Nullable[T]``     T's node with ``"null"`` added to its type   T's kind (null counts as absent)
``Unchecked[T]``    nothing: the file may carry it, v1 never     T's kind
                    constrained it
=================== ============================================ ==============================

A field whose default is None and whose type is not ``Nullable`` may be absent but not null, as
in the JSON Schema. Typed reading (:meth:`ConfigModel.of`) is meant for configs that passed the
schema; it then never fails (an ``Unchecked`` field holds whatever the file holds).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel, BeforeValidator, ConfigDict, PrivateAttr, model_validator
from pydantic.fields import FieldInfo

# --------------------------------------------------------------------------- field kinds

#: field kinds: what a converter requires of a research config's value (null counts as absent);
#: the words are the error message's (``config field X must be a positive integer``)
POSITIVE_INT, NON_NEGATIVE_INT, POSITIVE_REAL, BOOL, STRING, OBJECT, STRINGS, INDEXES = (
    "a positive integer", "a non-negative integer", "a positive number", "true or false", "a string", "an object",
    "a list of strings", "a list of non-negative integers")


# --------------------------------------------------------------------------- markers


@dataclass(frozen=True)
class Def:
    """``Annotated`` marker: the type is published once, as ``$defs[name]``, and referenced."""

    name: str


@dataclass(frozen=True)
class Schema:
    """``Annotated`` marker: JSON Schema keywords pydantic has no words for (``uniqueItems``, ``pattern``,
    ``anyOf``, ``format``); the schema states them, typed reading does not check them."""

    keywords: dict[str, Any]

    def __hash__(self) -> int:  # dict fields: hash by content, for typing's Annotated cache
        return hash(repr(sorted(self.keywords.items())))


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


_NULLABLE = _Marker("Nullable")
#: ``Annotated[Literal["greedy"], AS_ENUM]``: a set of values a later version may extend, published as
#: ``enum`` even while it has one member (a one-value ``Literal`` is otherwise a ``const``)
AS_ENUM = _Marker("AsEnum")


@dataclass(frozen=True)
class _Unchecked:
    """``Annotated`` marker of :data:`Unchecked`: the type the field is meant to hold."""

    meant: Any


class Nullable:
    """``Nullable[T]``: T, or JSON null (``target_hidden_size``: null when H_t = H)."""

    def __class_getitem__(cls, tp: Any) -> Any:
        return Annotated[Union[tp, None], _NULLABLE]  # noqa: UP007  (a runtime type expression)


class Unchecked:
    """``Unchecked[T]``: a field the file may carry (``rope_scaling``, ``layer_types``) that the v1 schema
    never constrained: typed reading keeps the value as it is, the schema says nothing of it, and a
    converter still requires T's kind of a research config's value."""

    def __class_getitem__(cls, tp: Any) -> Any:
        return Annotated[Any, _Unchecked(tp)]


def _whole(value: Any) -> Any:
    """A float with no fraction as an int: JSON Schema counts ``1.0`` (and ``9.2e18``) as an integer,
    pydantic's int refuses a float beyond 64 bits."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


#: a JSON integer (``3`` or ``3.0``)
Integer = Annotated[int, BeforeValidator(_whole)]
PositiveInt = Annotated[Integer, at.Ge(1)]
NonNegativeInt = Annotated[Integer, at.Ge(0)]
#: a JSON number > 0; an integer stays an integer (``rope_theta: 10000``), as in the file
PositiveNumber = Annotated[Union[int, float], at.Gt(0)]  # noqa: UP007
NonNegativeNumber = Annotated[Union[int, float], at.Ge(0)]  # noqa: UP007


@dataclass(frozen=True)
class Forbidden:
    """Keys a block must not have, and why (the schema's ``not``; its description is the message).

    Attributes:
        keys: the keys; having any one of them is the violation.
        why: one line: what the key would mean to vLLM, what to write instead.
    """

    keys: tuple[str, ...]
    why: str

    def node(self) -> dict[str, Any]:
        if len(self.keys) == 1:
            return {"required": [self.keys[0]], "description": self.why}
        return {"anyOf": [{"required": [k]} for k in self.keys], "description": self.why}


# --------------------------------------------------------------------------- the base class


class ConfigModel(BaseModel):
    """A block of ``config.json`` (the whole config, ``speculators_config``, a decoder config, ...).

    Unknown keys are kept (the schema allows them), in the order given. Class-level data:

    Attributes:
        schema_name: published once as ``$defs[schema_name]`` and referenced (None: inlined, or,
            for a subclass of a published block, ``{"$ref": parent, ...what differs}``).
        schema_description: the block's description in the schema.
        forbidden: keys the block must not have (:class:`Forbidden`).
    """

    model_config = ConfigDict(extra="allow", defer_build=True, protected_namespaces=())

    schema_name: ClassVar[str | None] = None
    schema_description: ClassVar[str] = ""
    forbidden: ClassVar[Forbidden | None] = None

    _keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_key_order(cls, data: Any, handler: Any) -> Any:
        model = handler(data)
        if isinstance(data, dict):
            model._keys = tuple(data)
        return model

    @classmethod
    def of(cls: type[_M], data: dict[str, Any]) -> _M:
        """The typed view of a parsed block (nested blocks typed too; the dict is not changed).

        Raises:
            pydantic.ValidationError: ``data`` does not fit the types; never for a config the
                schema accepts (``tests/test_config_types.py`` checks it).
        """
        return cls.model_validate(data)

    def keys(self) -> list[str]:
        """The keys the block has, in order: those given, then any set since."""
        extra = self.__pydantic_extra__ or {}
        later = [k for k in (*type(self).model_fields, *extra) if k not in self._keys and (k in self.model_fields_set or k in extra)]
        return [*self._keys, *later]

    def has(self, key: str) -> bool:
        """The block has ``key`` (given, or set since; a default does not count)."""
        return key in self._keys or key in self.model_fields_set or key in (self.__pydantic_extra__ or {})

    def value(self, key: str) -> Any:
        """The value of ``key`` (a declared field or an unknown key)."""
        extra = self.__pydantic_extra__ or {}
        return extra[key] if key in extra else getattr(self, key)

    def dump(self) -> dict[str, Any]:
        """The block as ``config.json`` holds it: plain JSON values, keys in :meth:`keys` order (a
        builder's argument order is the file's order), defaults not written."""
        return {k: _plain(self.value(k)) for k in self.keys()}


_M = TypeVar("_M", bound=ConfigModel)


def _plain(value: Any) -> Any:
    if isinstance(value, ConfigModel):
        return value.dump()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------- types, taken apart


@dataclass
class _Type:
    """A field's type with its ``Annotated`` layers peeled: the bare type and what was said of it."""

    base: Any
    meta: list[Any]

    @classmethod
    def of(cls, annotation: Any, meta: list[Any] | None = None) -> _Type:
        meta = list(meta or [])
        while get_origin(annotation) is Annotated:
            annotation, *more = get_args(annotation)
            meta = [*more, *meta]
        # ``Annotated[int, Field(ge=0)]``: the bounds pydantic keeps in the FieldInfo
        return cls(annotation, [x for m in meta for x in (m.metadata if isinstance(m, FieldInfo) else [m])])

    def find(self, kind: type) -> Any:
        return next((m for m in self.meta if isinstance(m, kind)), None)

    def members(self) -> tuple[list[Any], _Type]:
        """The union's members other than None, and, when one is left, this type with it as the base
        (its own ``Annotated`` layers peeled and added: ``Nullable[PositiveInt]``)."""
        members = [m for m in _members(self.base) if m is not type(None)]
        if len(members) != 1:
            return members, self
        inner = _Type.of(members[0])
        return [inner.base], _Type(inner.base, [*inner.meta, *self.meta])


def _members(tp: Any) -> list[Any]:
    """The members of a union (``X | None`` too), else ``[tp]``."""
    return list(get_args(tp)) if get_origin(tp) in (Union, types.UnionType) else [tp]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, ConfigModel)


def _bounds(t: _Type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in t.meta:
        if isinstance(m, at.Ge):
            out["minimum"] = m.ge
        elif isinstance(m, at.Gt):
            out["exclusiveMinimum"] = m.gt
        elif isinstance(m, at.Le):
            out["maximum"] = m.le
        elif isinstance(m, at.MinLen):
            out["minLength"] = m.min_length
        elif isinstance(m, Schema):
            out.update(m.keywords)
    return out


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


# --------------------------------------------------------------------------- schema nodes


class SchemaBuilder:
    """Turns config classes into JSON Schema nodes, collecting the ``$defs`` they reference.

    Attributes:
        defs: ``$defs`` so far, by name, in the order first met.
    """

    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}

    def ref(self, name: str) -> dict[str, str]:
        return {"$ref": f"#/$defs/{name}"}

    def type_node(self, annotation: Any, meta: list[Any] | None = None) -> dict[str, Any] | None:
        """The node of a type (None: :data:`Unchecked`, nothing to say)."""
        t = _Type.of(annotation, meta)
        if t.find(_Unchecked):
            return None
        d = t.find(Def)
        if d is not None:
            if d.name not in self.defs:
                self.defs[d.name] = {}  # reserved first: a definition may refer to itself
                self.defs[d.name] = self.type_node(t.base, [m for m in t.meta if m is not d])
            return self.ref(d.name)
        members, t = t.members()
        nullable = t.find(_Marker) is _NULLABLE
        if len(members) > 1:  # int | float: a JSON number
            if set(members) != {int, float}:
                raise TypeError(f"no JSON Schema for the union {t.base!r}")
            node: dict[str, Any] = {"type": "number"}
        else:
            node = self._single(members[0], as_enum=AS_ENUM in t.meta)
        node.update(_bounds(t))
        if nullable:
            node["type"] = [node["type"], "null"]
        if node.get("type") == "array" and "minLength" in node:
            node["minItems"] = node.pop("minLength")
        return node

    def _single(self, tp: Any, as_enum: bool = False) -> dict[str, Any]:
        origin = get_origin(tp)
        if origin is Literal:
            values = list(get_args(tp))
            return {"const": values[0]} if len(values) == 1 and not as_enum else {"enum": values}
        if origin in (list, tuple):
            (item,) = get_args(tp)[:1]
            inner = self.type_node(item)
            return {"type": "array", **({"items": inner} if inner else {})}
        if origin is dict:
            _, value = get_args(tp)
            inner = self.type_node(value) if value is not Any else None
            return {"type": "object", **({"additionalProperties": inner} if inner else {})}
        if tp is dict:
            return {"type": "object"}
        if _is_model(tp):
            return self.model_ref(tp)
        if tp in _JSON_TYPES:
            return {"type": _JSON_TYPES[tp]}
        if tp is Any:
            return {}
        raise TypeError(f"no JSON Schema for {tp!r}")

    def field_node(self, model: type[ConfigModel], name: str) -> dict[str, Any] | None:
        """A field's node: its description first, then its type's."""
        info = model.model_fields[name]
        node = self.type_node(info.annotation, info.metadata)
        if node is None:
            return None
        if isinstance(info.json_schema_extra, dict):
            node.update(info.json_schema_extra)
        return {"description": info.description, **node} if info.description else node

    def model_ref(self, model: type[ConfigModel]) -> dict[str, Any]:
        """A block used as a field: ``$ref`` to its definition, or, for an unpublished subclass of a
        published block, ``$ref`` to that plus what the subclass says differently."""
        if "schema_name" in model.__dict__ and model.schema_name:
            if model.schema_name not in self.defs:
                self.defs[model.schema_name] = {}
                self.defs[model.schema_name] = self.model_node(model)
            return self.ref(model.schema_name)
        parent = published_parent(model)
        if parent is None:
            return self.model_node(model)
        return {**self.model_ref(parent), **self.difference(model, parent)}

    def properties(self, model: type[ConfigModel], names: list[str]) -> dict[str, Any]:
        out = {}
        for name in names:
            node = self.field_node(model, name)
            if node is not None:
                out[name] = node
        return out

    def model_node(self, model: type[ConfigModel]) -> dict[str, Any]:
        """The whole node of a block: description, ``type: object``, required fields, properties, ``not``."""
        node: dict[str, Any] = {"description": model.schema_description} if model.schema_description else {}
        node["type"] = "object"
        required = [n for n, f in model.model_fields.items() if f.is_required()]
        if required:
            node["required"] = required
        node["properties"] = self.properties(model, list(model.model_fields))
        if model.forbidden is not None:
            node["not"] = model.forbidden.node()
        return node

    def difference(self, model: type[ConfigModel], parent: type[ConfigModel], *, always: tuple[str, ...] = ()) -> dict[str, Any]:
        """What ``model`` says beyond ``parent``: its description, the fields it requires that the parent
        does not, its own ``not``, and the fields it adds or states differently (``always``: required
        whatever the types say)."""
        node: dict[str, Any] = {"description": model.schema_description} if model.schema_description != parent.schema_description else {}
        base = parent.model_fields
        required = [n for n, f in model.model_fields.items() if f.is_required() and not (n in base and base[n].is_required())]
        required += [n for n in always if n not in required]
        if required:
            node["required"] = required
        if model.forbidden is not None and model.forbidden != parent.forbidden:
            node["not"] = model.forbidden.node()
        props = {}
        for name in model.model_fields:
            mine = self.field_node(model, name)
            if mine is not None and (name not in base or mine != self.field_node(parent, name)):
                props[name] = mine
        if props:
            node["properties"] = props
        return node


def published_parent(model: type[ConfigModel]) -> type[ConfigModel] | None:
    """The nearest base class of ``model`` that is published under a ``schema_name``, or None."""
    for base in model.__mro__[1:]:
        if _is_model(base) and "schema_name" in base.__dict__ and base.schema_name:
            return base
    return None


def model_node(model: type[ConfigModel]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(node, $defs)`` of one block on its own."""
    b = SchemaBuilder()
    node = b.model_node(model)
    return node, b.defs


# --------------------------------------------------------------------------- field kinds


def kind_of(annotation: Any, meta: list[Any] | None = None) -> str | None:
    """The field kind (:data:`POSITIVE_INT`, ...) a type asks of a research config's value, or None."""
    t = _Type.of(annotation, meta)
    unchecked = t.find(_Unchecked)
    if unchecked is not None:
        return kind_of(unchecked.meant)
    members, t = t.members()
    bounds = _bounds(t)
    if set(members) == {int, float}:
        return POSITIVE_REAL if "exclusiveMinimum" in bounds else None
    (tp,) = members
    origin = get_origin(tp)
    if origin is Literal:
        values = get_args(tp)
        return BOOL if all(isinstance(v, bool) for v in values) else STRING if all(isinstance(v, str) for v in values) else None
    if tp is bool:
        return BOOL
    if tp is int:
        return {1: POSITIVE_INT, 0: NON_NEGATIVE_INT}.get(bounds.get("minimum"))
    if tp is str:
        return STRING
    if tp is dict or origin is dict or _is_model(tp):
        return OBJECT
    if origin in (list, tuple):
        item = kind_of(get_args(tp)[0])
        return {STRING: STRINGS, NON_NEGATIVE_INT: INDEXES}.get(item)
    return None


def field_kinds(model: type[ConfigModel], *names: str, beyond: type[ConfigModel] | None = None) -> dict[str, str]:
    """``{field: kind}`` for the fields of ``model`` (``names``, else all; ``beyond``: only those the
    block adds to that base class) whose type has a kind: the table a converter checks a research
    config's fields against (``converters/base.py::check_source_types``).

    Raises:
        KeyError: a name that is no field of ``model``.
        TypeError: a named field whose type has no kind.
    """
    fields = model.model_fields
    chosen = list(names) or [n for n in fields if beyond is None or n not in beyond.model_fields]
    out = {}
    for name in chosen:
        info = fields[name]
        kind = kind_of(info.annotation, info.metadata)
        if kind is None and names:
            raise TypeError(f"{model.__name__}.{name} has no field kind")
        if kind is not None:
            out[name] = kind
    return out


__all__ = [
    "AS_ENUM", "BOOL", "Integer", "INDEXES", "NON_NEGATIVE_INT", "OBJECT", "POSITIVE_INT", "POSITIVE_REAL", "STRING", "STRINGS", "ConfigModel", "Def",
    "Forbidden", "NonNegativeInt", "NonNegativeNumber", "Nullable", "PositiveInt", "PositiveNumber", "Schema", "SchemaBuilder",
    "Unchecked", "field_kinds", "kind_of", "model_node", "published_parent",
]
