"""The simulated system kvsim's ``qbruntime`` runs on: its cards, the host's clock, and the
rule for runtime calls from several threads.

``kvsim exec`` describes the system to the child process in environment variables (read
once, by :func:`system`):

- ``KVSIM_QB_HW``: the hardware preset of every card (default ``aries``); its device name
  is ``aries-rb`` (``regulus-ra`` for the ``regulus`` preset), as ``Accelerator`` and
  ``get_available_devices`` see it;
- ``KVSIM_QB_CARDS``: how many cards (device numbers ``0..N-1``; default 1);
- ``KVSIM_QB_FUNCTIONAL``: ``1`` computes every value, ``0`` times only (a card then
  returns all-zero logits: its times are exact, its values not computed); unset: what the
  first model launched on a card was compiled for;
- ``KVSIM_QB_CLOCK``: ``sim`` | ``sim+host`` | ``wall`` (:mod:`.clock`; default ``wall``
  when the variable is unset, i.e. outside ``kvsim exec``);
- ``KVSIM_QB_TRACE_CALLS``: a file the call record is written to at exit (:mod:`.calltrace`).

Calls are one at a time per process, as one host thread issuing blocking calls makes
them. A call that arrives from another thread while one runs waits for it when both are
on the same card and the model has one instance (the real card serializes those too);
otherwise (calls on two cards, or on two instances of a single-core-mode model, that
would overlap on the real system) it raises :class:`NotSimulatedError`.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kvsim.errors import ConfigError
from sim.runtime.vendor import clock as vclock
from sim.runtime.vendor.errors import NotSimulatedError, QbRuntimeError

ENV_HW, ENV_CARDS, ENV_FUNCTIONAL = "KVSIM_QB_HW", "KVSIM_QB_CARDS", "KVSIM_QB_FUNCTIONAL"
ENV_CLOCK, ENV_TRACE = "KVSIM_QB_CLOCK", "KVSIM_QB_TRACE_CALLS"
#: the vendor's target device names (mblt-npu-python ``supported_target_devices``)
DEVICE_NAMES = ("aries-rb", "regulus-ra", "regulus-rb", "regulus-ra-usb", "regulus-rb-usb")
#: most cards one simulated system holds (an assumption: an MLA400 card holds four ARIES
#: chips, FACTS.md; a host seldom has more than a few cards)
MAX_CARDS = 16


def device_name_of(preset: str) -> str:
    """The vendor's device name of a card of hardware preset ``preset``."""
    return "regulus-ra" if preset.startswith("regulus") else "aries-rb"


@dataclass(frozen=True)
class Settings:
    hw: str = "aries"
    cards: int = 1
    functional: bool | None = None
    clock: str = "wall"
    trace_calls: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ) -> Settings:
        from sim.device.hw import preset_names

        hw = env.get(ENV_HW, "aries")
        if hw not in preset_names():
            raise ConfigError(f"{ENV_HW}={hw!r}: unknown hardware preset; valid: "
                              f"{', '.join(preset_names())}")
        raw = env.get(ENV_CARDS, "1")
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_CARDS:
            raise ConfigError(f"{ENV_CARDS}={raw!r}: must be an integer 1..{MAX_CARDS}")
        fun = env.get(ENV_FUNCTIONAL)
        if fun not in (None, "0", "1"):
            raise ConfigError(f"{ENV_FUNCTIONAL}={fun!r}: must be 1 (functional), 0 "
                              f"(timing only) or unset")
        mode = env.get(ENV_CLOCK, "wall")
        if mode not in vclock.MODES:
            raise ConfigError(f"{ENV_CLOCK}={mode!r}: valid: {', '.join(vclock.MODES)}")
        return cls(hw=hw, cards=int(raw), functional=None if fun is None else fun == "1",
                   clock=mode, trace_calls=env.get(ENV_TRACE) or None)


class Card:
    """One simulated card: its kvsim accelerator, made at the first launch on it."""

    def __init__(self, dev_no: int, hw: str, functional: bool | None):
        self.dev_no, self.hw, self.device_name = dev_no, hw, device_name_of(hw)
        self._functional = functional
        self.acc: Any = None  # sim.runtime.Accelerator
        self.warned_timing_only = False

    def accelerator(self, functional: bool) -> Any:
        """The card's kvsim accelerator, functional as asked (the first launch decides;
        a later model that needs the other mode is refused)."""
        from sim.runtime import Accelerator

        want = self._functional if self._functional is not None else functional
        if self.acc is None:
            self.acc = Accelerator(self.dev_no, hw=self.hw, functional=want)
        elif self.acc.functional != want:
            raise QbRuntimeError(f"card {self.device_name} #{self.dev_no} runs "
                                 f"{'functional' if self.acc.functional else 'timing-only'} "
                                 f"models; this model needs the other mode", "Model_Invalid")
        return self.acc


class System:
    """The cards and the host clock. ``patch_time``: the clock becomes ``time.perf_counter``
    (as under ``kvsim exec``); else it is kept here only (tests)."""

    def __init__(self, settings: Settings, *, patch_time: bool = True):
        from sim.runtime import tracing

        self.settings = settings
        self.cards = [Card(i, settings.hw, settings.functional) for i in range(settings.cards)]
        if patch_time:
            self.clock = vclock.install(settings.clock)
        else:
            self.clock = None if settings.clock == "wall" else vclock.VirtualClock(
                settings.clock)
        #: (dev_no, op) -> [device calls, simulated ps], every call on this system's cards
        self.device_calls: dict[tuple[int, str], list[int]] = {}
        tracing.add_listener(self._note_device_call)
        self._lock = threading.RLock()
        self._meta = threading.Lock()
        self._owner: int | None = None
        self._owner_card: Card | None = None
        self._depth = 0

    def resolve(self, device_name: str, dev_no: int) -> Card:
        """The card ``Accelerator(device_name, dev_no)`` opens (the vendor's rules: a base
        name matches every device name it begins, ``auto`` the only kind present)."""
        name = device_name.lower()
        kind = self.cards[0].device_name
        if name != "auto" and not kind.startswith(name):
            if not any(d.startswith(name) for d in DEVICE_NAMES):
                raise QbRuntimeError(f"Accelerator: unknown device name {device_name!r}; "
                                     f"known: auto, {', '.join(DEVICE_NAMES)}",
                                     "Accelerator_UnknownDevice")
            raise QbRuntimeError(f"Accelerator: no {device_name!r} device: the simulated "
                                 f"system has {len(self.cards)} {kind} card(s) "
                                 f"(kvsim exec --hw, --cards)", "Accelerator_NoDevice")
        if not 0 <= dev_no < len(self.cards):
            raise QbRuntimeError(f"Accelerator: no {kind} device number {dev_no}; the "
                                 f"simulated system has 0..{len(self.cards) - 1}",
                                 "Accelerator_NoDevice")
        return self.cards[dev_no]

    def _note_device_call(self, kind: str, acc: Any, rec: Any) -> None:
        if kind != "call" or not any(c.acc is acc for c in self.cards):
            return
        e = self.device_calls.setdefault((acc.dev_no, rec.op), [0, 0])
        e[0] += 1
        e[1] += rec.end_ps - rec.start_ps

    def close(self) -> None:
        """Stop counting this system's device calls (a new system replaces it)."""
        from sim.runtime import tracing

        tracing.remove_listener(self._note_device_call)

    @contextmanager
    def call(self, card: Card, what: str, *, instances: int = 1) -> Iterator[None]:
        """One runtime call on ``card``: one at a time (see the module docstring); the
        card's clock and the host's virtual clock kept as one timeline."""
        me = threading.get_ident()
        with self._meta:
            busy = self._owner not in (None, me)
            if busy and (self._owner_card is not card or instances > 1):
                raise NotSimulatedError(what, "runtime calls from several threads that would "
                                        "overlap on the real system (on two cards, or on two "
                                        "instances of a single-core-mode model): kvsim runs "
                                        "one call at a time")
        self._lock.acquire()
        self._owner, self._owner_card = me, card
        self._depth += 1
        clock = self.clock
        start = clock.begin_call() if clock is not None else 0
        try:
            if clock is not None and card.acc is not None:
                card.acc.idle_until(start)
            yield
        finally:
            end = card.acc.device.env.now if card.acc is not None else start
            if clock is not None:
                clock.end_call(end)
            self._depth -= 1
            if not self._depth:
                self._owner = self._owner_card = None
            self._lock.release()

    def timing_only_note(self, card: Card) -> None:
        if not card.warned_timing_only:
            card.warned_timing_only = True
            print(f"kvsim: card {card.device_name} #{card.dev_no} is timing-only: infer "
                  f"returns all-zero logits (times are exact, values are not computed)",
                  file=sys.stderr)


_system: System | None = None
_system_lock = threading.Lock()


def system() -> System:
    """The process's simulated system (made from the environment on first use)."""
    global _system
    with _system_lock:
        if _system is None:
            _system = System(Settings.from_env(os.environ))
            if _system.settings.trace_calls:
                atexit.register(_write_trace, _system)
        return _system


def reset_system(settings: Settings | None = None) -> System:
    """Start over with a new system (tests): the old cards and their models are dropped;
    ``time.perf_counter`` is not patched (the clock is the system's own)."""
    global _system
    with _system_lock:
        if _system is not None:
            _system.close()
        _system = System(settings or Settings.from_env(os.environ), patch_time=False)
        return _system


def _write_trace(sys_: System) -> None:
    from kvsim.errors import OutputError
    from sim.runtime.vendor.report import write_trace

    try:
        write_trace(sys_, sys_.settings.trace_calls)
    except OutputError as err:  # at the program's exit: one line, not a traceback
        print(f"kvsim: error: {err}", file=sys.stderr)


__all__ = ["DEVICE_NAMES", "ENV_CARDS", "ENV_CLOCK", "ENV_FUNCTIONAL", "ENV_HW", "ENV_TRACE",
           "Card", "Settings", "System", "device_name_of", "reset_system", "system"]
