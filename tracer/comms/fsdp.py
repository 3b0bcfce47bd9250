"""FSDP: notes each FSDP unit built, FSDP1's FullyShardedDataParallel modules and FSDP2's
fully_shard parameter groups (FSDPParamGroup), so that their collectives are named FSDP's
(tracer.comms.owners). FSDP issues them as torch.distributed calls, which tracer.comms.c10d
records; only the constructors are observed here, and compiled code never runs those.

Importing torch.distributed.fsdp takes over a second, so the tracer never imports it itself:
the constructors are patched when the script imports it (an import hook, removed once it has
fired), or at install where it already is imported.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import sys

from tracer.comms.owners import fsdp1_sizes, fsdp2_sizes
from tracer.schema import ISSUER_FSDP1, ISSUER_FSDP2

FSDP_PACKAGE = "torch.distributed.fsdp"
# (module, class, issuer, what its units issue): a torch without one of them observes the other
UNITS = (
    ("torch.distributed.fsdp.fully_sharded_data_parallel", "FullyShardedDataParallel",
     ISSUER_FSDP1, fsdp1_sizes),
    ("torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDPParamGroup", ISSUER_FSDP2,
     fsdp2_sizes),
)


def group_name(pg) -> str:
    """A process group's name as the comms records write it."""
    return str(pg.group_name)


class FsdpHooks:
    def __init__(self, recorder, owners):
        self.recorder = recorder
        self.owners = owners
        self._patches = None
        self._finder: AfterImport | None = None

    def install(self, patches) -> None:
        self._patches = patches
        if FSDP_PACKAGE in sys.modules:
            self._observe_units()
        else:
            self._finder = AfterImport(FSDP_PACKAGE, self._on_import)
            sys.meta_path.insert(0, self._finder)

    def uninstall(self) -> None:
        finder, self._finder = self._finder, None
        if finder is not None:
            finder.remove()

    def _on_import(self) -> None:
        self._finder = None
        if not self.recorder.active:
            return
        try:
            self._observe_units()
        except Exception as exc:
            self.recorder.fail("observing FSDP's constructors", exc)

    def _observe_units(self) -> None:
        for module_name, class_name, issuer, sizes_of in UNITS:
            try:
                cls = getattr(importlib.import_module(module_name), class_name, None)
            except ImportError:
                cls = None
            if cls is not None:
                self._observe(cls, issuer, sizes_of)

    def _observe(self, cls, issuer: str, sizes_of) -> None:
        """cls.__init__ marks its thread as building a unit of `issuer`, then notes the sizes of
        the unit's collectives."""
        recorder, owners = self.recorder, self.owners
        original_init = cls.__init__

        @functools.wraps(original_init)
        def __init__(unit, *args, **kwargs):
            if not recorder.active:
                return original_init(unit, *args, **kwargs)
            span = owners.building(issuer)
            try:
                original_init(unit, *args, **kwargs)
            finally:
                owners.built(span)
            try:
                owners.add_fsdp(issuer, sizes_of(unit, group_name))
            except Exception as exc:
                recorder.fail(f"noting an {issuer} unit", exc)

        self._patches.patch(cls, "__init__", __init__)


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then()` once, right after module `name` has been imported (whoever imports it),
    and leaves sys.meta_path. It finds the module as the other finders do and only wraps the
    loader's exec_module; the module gets the real loader back before its code runs."""

    def __init__(self, name: str, then):
        self.name = name
        self.then = then
        self._finding = False

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self._finding:
            return None
        self._finding = True  # the module's import lock is held: no other thread is here
        try:
            spec = None
            for finder in [f for f in sys.meta_path if f is not self]:
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    break
        finally:
            self._finding = False
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _ThenLoader(spec.loader, self)
        return spec

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def imported(self) -> None:
        self.remove()
        self.then()


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader, finder: AfterImport):
        self._loader = loader
        self._finder = finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self._loader
        self._loader.exec_module(module)
        self._finder.imported()

    def __getattr__(self, name):
        return getattr(self._loader, name)
