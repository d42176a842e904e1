"""The error for an aten op on a ShardTensor with no sharding rule, naming the torch function
the user called as well as the aten op (``torch.fft.fft`` reaches dispatch as
``aten._fft_r2c``), and how to add a rule. Imports nothing from the package, so ``tensor.py``
and ``dispatch.py`` both may."""

from __future__ import annotations

from typing import Any

from meshshard.errors import NoShardingRuleError

# torch's C modules and the public names of their functions (``torch._C._fft.fft_fft`` is
# ``torch.fft.fft``)
_PUBLIC = {"torch._C._nn": ("torch.nn.functional", ""), "torch._C._linalg": ("torch.linalg",
           "linalg_"), "torch._C._fft": ("torch.fft", "fft_"),
           "torch._C._special": ("torch.special", "special_")}


def function_name(func: Any) -> str:
    """``torch.fft.fft``, ``torch.Tensor.sort``, ``torch.sort`` (best effort)."""
    mod = getattr(func, "__module__", None) or ""
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    if mod.startswith("torch._C"):
        mod, prefix = _PUBLIC.get(mod, ("torch", ""))
        if prefix and qual.startswith(prefix):
            qual = qual[len(prefix):]
    if qual.startswith("_VariableFunctionsClass."):  # torch.sort and the like
        return "torch." + qual.rsplit(".", 1)[-1]
    if "TensorBase" in qual or (not mod and "." in qual):
        return "torch.Tensor." + qual.rsplit(".", 1)[-1]
    return f"{mod}.{qual}" if mod else qual


class NoRuleError(NoShardingRuleError):
    """An aten op reached a ShardTensor with no sharding rule for it. ``func``: the torch
    function that called it (None while still inside dispatch)."""

    def __init__(self, op: Any, func: Any = None, why: str | None = None) -> None:
        self.op, self.func, self.why = op, func, why
        head = (f"ShardTensor has no sharding rule for {op}" if func is None else
                f"ShardTensor has no sharding rule for {function_name(func)} (it calls {op}: "
                f"no sharding rule for {op})")
        if why:
            head += f" ({why})"
        super().__init__(
            f"{head}. Redistribute the input to Replicate() first "
            "(x.redistribute([Replicate()]), collective), or add a rule: "
            f"@meshshard.shardtensor.register_rule(torch.ops.{op}) over a function "
            "(func, args, kwargs) -> Plan (docs/design/core.md, 'Adding a rule')")

    def within(self, func: Any) -> NoRuleError:
        return self if self.func is not None else NoRuleError(self.op, func, self.why)
