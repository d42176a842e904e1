"""The one registry of ShardTensor's sharding rules: one rule per op, added with one decorator.

A rule is registered for an aten op overload (dispatch level, below autograd), for a torch
function (``F.linear``, ``torch.Tensor.__getitem__``: function level, above autograd), or for
one of the three generic slots (:data:`POINTWISE`, :data:`POINTWISE_INPLACE`,
:data:`FALLBACK`) that serve the ops with no rule of their own. A second registration of the
same op raises :class:`RuleConflictError` at import unless it names the rule it extends
(``extends=``): the chain of rules for an op is then explicit and cannot depend on import order.
A rule for an op that the pointwise rule already serves must say so (``extends=POINTWISE``).

Rules:

- a *plan* rule ``fn(func, args, kwargs) -> Plan`` decides how the local pieces are converted
  and computed (cached per layout); it may return ``NotImplemented`` for a case it leaves to the
  rule it extends (or, for an op with no base, to the fallback);
- a *direct* rule (``direct=True``, and every function-level rule) computes the result itself.

Imports nothing from the package (``tensor.py``, ``dispatch.py`` and the rule modules build on it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["FALLBACK", "POINTWISE", "POINTWISE_INPLACE", "Rule", "RuleConflictError",
           "register_rule", "registered_rules", "rule_for"]

#: the rule of every pointwise aten op (``torch.Tag.pointwise``) without a rule of its own
POINTWISE = "pointwise"
#: the rule of every in-place pointwise aten op (``add_``, ...) without a rule of its own
POINTWISE_INPLACE = "pointwise_"
#: the rule of every other aten op without a rule: local where that is exact, else an error
FALLBACK = "fallback"
SLOTS = (POINTWISE, POINTWISE_INPLACE, FALLBACK)


class RuleConflictError(RuntimeError):
    """A second rule for an op that did not declare which rule it extends (or named another)."""


@dataclass(frozen=True)
class Rule:
    """One registered rule.

    Attributes
    ----------
    fn : callable
        The rule.
    direct : bool
        It returns the result (else a ``Plan``).
    base : Rule, optional
        The rule it extends (it replaces it for this op and may call or defer to it).
    where : str
        ``module:function`` of the rule, for messages.
    """

    fn: Callable[..., Any]
    direct: bool
    base: Rule | None
    where: str


def _is_aten(op: Any) -> bool:
    return isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) or op in SLOTS


_REGISTRY: dict[Any, Rule] = {}
#: the fast paths read these (kept in step with the registry by :func:`register_rule`)
ATEN_RULES: dict[Any, Callable[..., Any]] = {}  # aten op or slot -> rule
DIRECT: set = set()  # the aten rules that return results, not plans
FUNCTION_RULES: dict[Any, Callable[..., Any]] = {}  # torch function -> rule


def _where(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def _name(op: Any) -> str:
    return op if isinstance(op, str) else (getattr(op, "__qualname__", None) or str(op))


def register_rule(*ops: Any, direct: bool = False, extends: Any = None) -> Callable:
    """Register the decorated function as the sharding rule of ``ops``.

    Parameters
    ----------
    *ops
        Aten op overloads (``torch.ops.aten.topk.default``), torch functions (``F.linear``),
        or a slot (:data:`POINTWISE`, :data:`POINTWISE_INPLACE`, :data:`FALLBACK`).
    direct : bool
        The rule returns the op's result instead of a ``Plan`` (function-level rules always do).
    extends : callable or str, optional
        The rule this one replaces for ``ops`` (it must be the one registered now), or
        :data:`POINTWISE` to take a pointwise op over from the pointwise rule.

    Returns
    -------
    callable
        A decorator that registers the function and returns it unchanged.

    Raises
    ------
    RuleConflictError
        An op has a rule and ``extends`` does not name it; ``extends`` names a rule an op does
        not have; a pointwise op without ``extends=POINTWISE``.

    Examples
    --------
    >>> import torch
    >>> from meshshard.shardtensor import RuleConflictError, register_rule
    >>> try:  # aten.view has a rule: a second one must name it in extends=
    ...     register_rule(torch.ops.aten.view.default)(lambda func, args, kwargs: None)
    ... except RuleConflictError as e:
    ...     print(str(e)[:40])
    aten.view.default already has a sharding
    """
    if not ops:
        msg = "register_rule needs at least one op"
        raise TypeError(msg)

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            _check(op, fn, extends)
        for op in ops:
            cur = _REGISTRY.get(op)
            aten_level = _is_aten(op)
            entry = Rule(fn, direct or not aten_level, cur, _where(fn))
            _REGISTRY[op] = entry
            if aten_level:
                ATEN_RULES[op] = fn
                if entry.direct:
                    DIRECT.add(fn)
            else:
                FUNCTION_RULES[op] = fn
        return fn

    return deco


def _check(op: Any, fn: Callable[..., Any], extends: Any) -> None:
    cur = _REGISTRY.get(op)
    if cur is None:
        if extends is None and isinstance(op, torch._ops.OpOverload) \
                and torch.Tag.pointwise in op.tags:
            msg = (f"{op} is a pointwise op, served by the pointwise rule: to replace it for "
                   f"this op, register_rule({op}, extends=POINTWISE)")
            raise RuleConflictError(msg)
        if extends is not None and extends != POINTWISE:
            msg = (f"{_name(op)}: {_where(fn)} extends {_name(extends)}, but the op has no "
                   "rule to extend (is the base's module imported first?)")
            raise RuleConflictError(msg)
        return
    if extends is None:
        msg = (f"{_name(op)} already has a sharding rule ({cur.where}); one rule per op: "
               f"a second one must extend it, register_rule(..., extends=<that rule>), "
               f"or change that rule ({_where(fn)} was refused)")
        raise RuleConflictError(msg)
    if extends is not cur.fn:
        msg = (f"{_name(op)}: {_where(fn)} extends {_name(extends)}, but the op's rule is "
               f"{cur.where}")
        raise RuleConflictError(msg)


def rule_for(op: Any) -> Rule | None:
    """The rule registered for ``op`` (None: none; aten ops then take a slot's)."""
    return _REGISTRY.get(op)


def registered_rules() -> dict[Any, Rule]:
    """Every op with a rule of its own (a copy), slots included."""
    return dict(_REGISTRY)
