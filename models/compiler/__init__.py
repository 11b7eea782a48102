"""The kvsim compiler: models + bit configs + hardware -> memory map and ISA programs."""

from .compiled import CORE_MODES, CompiledModel, CompileError, HardwareTarget, compile_model

__all__ = ["CORE_MODES", "CompiledModel", "CompileError", "HardwareTarget", "compile_model"]
