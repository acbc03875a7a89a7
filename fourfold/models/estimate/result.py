"""What :mod:`fourfold.models.estimate.memory` returns: per-role memory (:class:`RoleMemory`) and the two
phases' terms per device (:class:`Estimate`), with their one-line summary and table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

GiB = 1 << 30


@dataclass
class RoleMemory:
    """One role, per device. ``params`` = all parameters of the role's model (see the module
    docstring for the shared base), ``trainable_params`` those it trains."""

    params: int = 0
    trainable_params: int = 0
    weights_bytes: int = 0
    grads_bytes: int = 0
    optimizer_bytes: int = 0


@dataclass
class Estimate:
    """The result: per-role memory, and each phase's peak per device as named additive terms."""

    roles: dict[str, RoleMemory]
    generate: dict[str, int]
    train: dict[str, int]
    description: str
    train_notes: list = field(default_factory=list)
    """Where the training peak falls for each trained role in it (the start or the end of its
    backward), and what is freed by then: lines the table prints under the training terms."""

    @property
    def generate_peak_bytes(self) -> int:
        return sum(self.generate.values())

    @property
    def train_peak_bytes(self) -> int:
        return sum(self.train.values())

    @property
    def peak_bytes(self) -> int:
        return max(self.generate_peak_bytes, self.train_peak_bytes)

    def to_json(self) -> dict:
        """A JSON-serialisable dict: ``roles.<role>.{params, trainable_params, weights_bytes,
        grads_bytes, optimizer_bytes}`` for the four roles and ``per_device.{generate_peak_bytes,
        train_peak_bytes}``."""
        return {"roles": {name: {k: int(getattr(r, k)) for k in RoleMemory.__dataclass_fields__}
                          for name, r in self.roles.items()},
                "per_device": {"generate_peak_bytes": self.generate_peak_bytes,
                               "train_peak_bytes": self.train_peak_bytes}}

    def summary(self) -> str:
        """One line: the peak per device and the phase that sets it."""
        return (f"memory estimate ({self.description}): peak {fmt_bytes(self.peak_bytes)} per device "
                f"(generation {fmt_bytes(self.generate_peak_bytes)}, training {fmt_bytes(self.train_peak_bytes)})")

    def table(self, device_bytes: Optional[int] = None, device_name: str = "device") -> str:
        """A readable table; with ``device_bytes``, a last line saying whether the peak fits."""
        lines = [f"fourfold estimate: {self.description}", "",
                 f"{'role':<10}{'params':>10}{'trainable':>11}{'weights':>12}{'grads':>12}{'optimizer':>12}"]
        for name, r in self.roles.items():
            lines.append(f"{name:<10}{fmt_count(r.params):>10}{fmt_count(r.trainable_params):>11}"
                         f"{fmt_bytes(r.weights_bytes):>12}{fmt_bytes(r.grads_bytes):>12}{fmt_bytes(r.optimizer_bytes):>12}")
        for phase, terms, total in (("generation", self.generate, self.generate_peak_bytes),
                                    ("training", self.train, self.train_peak_bytes)):
            lines += ["", f"{phase} peak per device: {fmt_bytes(total)}"]
            lines += [f"  {k:<40}{fmt_bytes(v):>12}" for k, v in terms.items() if v]
            if phase == "training":
                lines += [f"  ({note})" for note in self.train_notes]
        lines += ["", "(live tensors; on CPU the RSS adds the framework, ~0.4 GiB, and memory glibc keeps after "
                      "freeing unless run.malloc_mmap_threshold_kib is set)"]
        if device_bytes is not None:
            cap = f"{device_name} ({device_bytes / GiB:.1f} GiB)"
            margin = device_bytes - self.peak_bytes
            lines += ["", f"fits on {cap}: {fmt_bytes(margin)} to spare" if margin >= 0
                      else f"does not fit on {cap}: {fmt_bytes(-margin)} over"]
        return "\n".join(lines)


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_count(n: int) -> str:
    """1234567 -> '1.23M'."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)
