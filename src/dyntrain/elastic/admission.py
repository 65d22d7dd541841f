"""Whether a worker computes the job's bits: the job's record of its numerics, and the pure
judgement of each worker's hello against it.

The first worker that runs the job's pinned numerics defines the job's bits: its observed
settings and canary digests (``dyntrain.elastic.numerics``, ``dyntrain.elastic.step.canary``) become
the job's ``NumericsRecord``, which the run folder keeps (``numerics.json``) so that a resumed
run, or a restarted coordinator, holds every later worker to the same bits. A worker whose
settings or digests differ is refused with what differs, or, where the user allows mixed
numerics, admitted, and the record says from which step the run is no longer bitwise.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from dyntrain.elastic.numerics import Numerics, pin_differences, setting_differences
from dyntrain.errors import ConfigError


@dataclass(frozen=True)
class CanaryDigest:
    """What a worker's canary computed (``dyntrain.elastic.step.canary``): the digest of the chunk
    it read (``data``) and of the loss and gradients it computed from it (``compute``)."""

    data: str = ""
    compute: str = ""


@dataclass(frozen=True)
class MixedWorker:
    """A worker admitted although it computes other bits (mixed numerics allowed)."""

    worker: str
    host: str
    step: int  # the job's newest step when it was admitted: bitwise up to here
    differs: tuple[str, ...]


@dataclass(frozen=True)
class NumericsRecord:
    """The job's numerics as its run folder keeps them (``numerics.json``).

    Args:
        pinned: What the job pins (None: a run that trained alone, pinning nothing).
        settings: What its first worker observed (``numerics.observe``).
        canary: Its first worker's canary digests.
        first: ``<worker> on <host>``: who defined them.
        mixed: Workers admitted although they compute other bits.
    """

    pinned: Numerics | None
    settings: dict
    canary: CanaryDigest
    first: str = ""
    mixed: tuple[MixedWorker, ...] = ()

    @property
    def bitwise_until(self) -> int | None:
        """The step up to which the run is bitwise its pinned numerics' (None: all of it)."""
        return min(m.step for m in self.mixed) if self.mixed else None

    def to_json(self) -> dict:
        return {"pinned": self.pinned.to_json() if self.pinned else None,
                "settings": self.settings, "canary": asdict(self.canary), "first": self.first,
                "mixed": [asdict(m) for m in self.mixed], "bitwise_until": self.bitwise_until}

    def encode(self) -> bytes:
        return (json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def decode(cls, raw: bytes | str, where: str) -> NumericsRecord:
        """The record in ``raw``; a ``ConfigError`` naming ``where`` if it is not one."""
        try:
            data = json.loads(raw)
            return cls(
                pinned=Numerics.from_json(data["pinned"]) if data["pinned"] else None,
                settings=dict(data["settings"]), canary=CanaryDigest(**data["canary"]),
                first=str(data.get("first", "")),
                mixed=tuple(MixedWorker(m["worker"], m["host"], int(m["step"]),
                                        tuple(m["differs"])) for m in data.get("mixed", ())))
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            raise ConfigError(f"{where} is not a numerics record ({exc}); delete it to record "
                              "the numerics again") from None


@dataclass(frozen=True)
class Verdict:
    """The judgement of one worker's hello.

    ``admit``: it may join; ``record``: the job's record from now on (a new one when this
    worker defined it, or one more mixed worker); ``reason``: why it was refused, or what
    differs when it was admitted with mixed numerics (empty when it computes the job's bits).
    """

    admit: bool
    record: NumericsRecord | None
    reason: str = ""
    changed: bool = False  # ``record`` is new: write it down
    differs: str = ""  # what differs, without who or what to do


@dataclass
class Candidate:
    """A worker's hello as the judgement needs it."""

    worker: str
    host: str
    settings: Mapping[str, object]
    canary: CanaryDigest
    differs: list[str] = field(default_factory=list)


def judge(pinned: Numerics | None, record: NumericsRecord | None, hello: Candidate,
          step: int, allow_mixed: bool) -> Verdict:
    """Admit, refuse or (``allow_mixed``) admit as mixed the worker of ``hello``.

    Args:
        pinned: The job's numerics (None: nothing pinned, as for a run that trained alone).
        record: The job's record so far (None: no worker defined it yet).
        hello: The worker, its observed settings and canary digests.
        step: The job's newest step (where a mixed worker's difference starts).
        allow_mixed: Admit workers that compute other bits, recording it.
    """
    who = f"{hello.worker} on {hello.host}"
    if not hello.settings:
        return Verdict(False, record, f"{who} reports no numerics (a dyntrain older than its "
                                      "job's?): it cannot prove it computes the job's bits",
                       differs="no numerics reported")
    unpinned = pin_differences(pinned, hello.settings) if pinned is not None else []
    if record is None:
        if unpinned:  # nobody defined the job's bits yet: not this worker
            return Verdict(False, None, f"{who} does not run the job's pinned numerics: "
                                        f"{'; '.join(unpinned)}{_HINT}",
                           differs="; ".join(unpinned))
        return Verdict(True, NumericsRecord(pinned, dict(hello.settings), hello.canary, who),
                       changed=True)
    differs = unpinned or setting_differences(record.settings, hello.settings)
    canary = _canary_differences(record.canary, hello.canary)
    if not differs and not canary:
        return Verdict(True, record)
    what = "; ".join(canary + differs)
    if not differs:
        what += ("; its settings are the job's: the difference lies in what they do not name "
                 "(the CPU's microarchitecture, a library build)")
    if allow_mixed:
        mixed = MixedWorker(hello.worker, hello.host, step, tuple(canary + differs))
        return Verdict(True, NumericsRecord(record.pinned, record.settings, record.canary,
                                            record.first, (*record.mixed, mixed)),
                       f"{who} computes other bits than the job ({what}): admitted as mixed "
                       f"numerics allow it; the run is no longer bitwise from step {step}",
                       changed=True, differs=what)
    hint = _HINT if unpinned else (" (--allow-mixed-numerics admits it, and the run is then "
                                   "no longer bitwise)")
    return Verdict(False, record, f"{who} computes other bits than the job: {what}{hint}",
                   differs=what)


_HINT = (" (a worker started by `dyntrain run` or `dyntrain worker` gets them; one started "
         "by hand must not change them: see docs/invariant.md)")


def _canary_differences(job: CanaryDigest, mine: CanaryDigest) -> list[str]:
    out = []
    if job.data != mine.data:
        out.append(f"its first chunk's data differ (digest {mine.data or '-'}, the job's "
                   f"{job.data}: decoding or augmentation)")
    if job.compute != mine.compute:
        out.append(f"canary {mine.compute or '-'} (the job's {job.compute})")
    return out
