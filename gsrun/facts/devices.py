"""Parse GPU device lists (``CUDA_VISIBLE_DEVICES``, ``SLURM_STEP_GPUS``,
``SLURM_JOB_GPUS``, ``gsrun-bind --gpus``) into typed :class:`DeviceToken`;
nothing is ``int()``-ed blindly (field case 11: ``int('MIG-377e...')``
crashed vLLM). Kinds: ``index`` (``3``), ``gpu-uuid``, ``gpu-uuid-prefix``
(``GPU-11111111``), ``mig-uuid`` (driver >= R470), ``mig-legacy``
(``MIG-GPU-<uuid>/<gi>/<ci>``, older drivers).

An ``index`` in ``SLURM_*_GPUS`` is a gres index = minor number (case 8), in
``CUDA_VISIBLE_DEVICES`` a CUDA ordinal renumbered from 0 in a constrained
step (case 9); :mod:`gsrun.bind.plan` resolves them. Set but empty is ``[]``
(CUDA sees no GPU); None only when unset.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gsrun.base.errors import InputError
from gsrun.base.ids import is_digits

TokenKind = Literal["index", "gpu-uuid", "gpu-uuid-prefix", "mig-uuid", "mig-legacy"]

_HEX_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# matched with re.fullmatch(..., re.I)
_RE_GPU_UUID = rf"GPU-{_HEX_UUID}"
_RE_GPU_PREFIX = r"GPU-[0-9a-f][0-9a-f-]{0,35}"
_RE_MIG_UUID = rf"MIG-{_HEX_UUID}"
_RE_MIG_LEGACY = rf"MIG-(GPU-{_HEX_UUID})/([0-9]{{1,3}})/([0-9]{{1,3}})"


def _index(text: str) -> int | None:
    """``[0-9]{1,6}`` -> its value, else None."""
    return int(text) if is_digits(text, 6) else None


#: values Slurm or users write that mean "no usable GPU" (Slurm writes
#: ``NoDevFiles`` when the gres has no ``File=``; ``-1`` hides all GPUs).
NO_DEVICE_VALUES = ("NoDevFiles", "-1")


@dataclass(frozen=True, slots=True)
class DeviceToken:
    """One entry of a device list (``text`` stripped): ``index``, or ``uuid``
    (the GPU UUID, its prefix, the MIG UUID, or for ``mig-legacy`` the parent
    GPU's, with ``gi``/``ci``), compared case-insensitively."""

    kind: TokenKind
    text: str
    index: int | None = None
    uuid: str | None = None
    gi: int | None = None
    ci: int | None = None

    @property
    def is_mig(self) -> bool:
        return self.kind in ("mig-uuid", "mig-legacy")

    @property
    def parent_uuid(self) -> str | None:
        """The physical GPU's UUID when the token names it (``gpu-uuid``,
        ``mig-legacy``); ``None`` for a prefix, a new-style MIG UUID or an index."""
        if self.kind in ("gpu-uuid", "mig-legacy"):
            return self.uuid
        return None

    def matches_uuid(self, gpu_uuid: str | None) -> bool:
        """True when this token names the GPU with UUID ``gpu_uuid`` (exact for
        ``gpu-uuid``/``mig-legacy``, by prefix for ``gpu-uuid-prefix``)."""
        if not gpu_uuid or self.uuid is None:
            return False
        g, u = gpu_uuid.lower(), self.uuid.lower()
        if self.kind == "gpu-uuid-prefix":
            return g.startswith(u)
        if self.kind in ("gpu-uuid", "mig-legacy"):
            return g == u
        return False


def parse_device_token(text: str, allow_ranges: bool = False) -> list[DeviceToken]:
    """One entry -> tokens (a list because a Slurm range ``0-3`` is 4 tokens,
    accepted only with ``allow_ranges``).

    Raises:
        InputError: an entry that is none of the forms above (a typo, a UUID
            cut short inside a group, a MIG prefix, a negative index, a range
            where only single devices are allowed).
    """
    t = text.strip()
    if _index(t) is not None:
        return [DeviceToken("index", t, index=int(t))]
    lo_t, dash, hi_t = t.partition("-")
    lo, hi = _index(lo_t), _index(hi_t)
    if dash and lo is not None and hi is not None and allow_ranges:
        if hi < lo or hi - lo > 4096:
            raise InputError("devices", "bad GPU index range", repr(t))
        return [DeviceToken("index", str(i), index=i) for i in range(lo, hi + 1)]

    if re.fullmatch(_RE_GPU_UUID, t, re.I):
        return [DeviceToken("gpu-uuid", t, uuid=t)]
    m = re.fullmatch(_RE_MIG_LEGACY, t, re.I)
    if m:
        return [DeviceToken("mig-legacy", t, uuid=m.group(1), gi=int(m.group(2)), ci=int(m.group(3)))]
    if re.fullmatch(_RE_MIG_UUID, t, re.I):
        return [DeviceToken("mig-uuid", t, uuid=t)]
    if re.fullmatch(_RE_GPU_PREFIX, t, re.I):
        return [DeviceToken("gpu-uuid-prefix", t, uuid=t)]
    raise InputError("devices", "not a GPU device name", repr(t)[:120],
                     hint="use an index (0), a UUID (GPU-...), a UUID prefix (GPU-8932f937) "
                          "or a MIG UUID (MIG-... or MIG-GPU-<uuid>/<gi>/<ci>)")


def parse_device_list(value: str | None, allow_ranges: bool = False) -> list[DeviceToken] | None:
    """``"0,1"`` / ``"GPU-...,MIG-..."`` -> tokens in order, duplicates once;
    None -> None; ``""``, ``NoDevFiles``, ``-1`` -> ``[]`` (no GPU).

    Raises:
        InputError: an entry that is no device name (see :func:`parse_device_token`).
    """
    if value is None:
        return None
    v = value.strip()
    if v in NO_DEVICE_VALUES or not v:
        return []
    out: list[DeviceToken] = []
    seen: set[str] = set()
    for part in v.split(","):
        if not part.strip():
            continue
        for tok in parse_device_token(part, allow_ranges=allow_ranges):
            key = tok.text.lower()
            if key not in seen:
                seen.add(key)
                out.append(tok)
    return out

